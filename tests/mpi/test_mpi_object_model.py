"""mpi4py's object model on allreduce.MPI's handles, in one process: handle numbers and fromhandle,
free() of created, duplicated and predefined objects, unhashable handles, copy constructors that
refuse other classes, pickles that keep subclasses, and the address constants."""

from __future__ import annotations

import copy
import ctypes
import operator
import pickle

import pytest

from allreduce import MPI


@pytest.fixture(autouse=True, scope="module")
def world_of_one():
    """This process joins a world of one on first use; leave it after, so later tests fork cleanly."""
    yield
    MPI.Finalize()


NULLS = [MPI.DATATYPE_NULL, MPI.REQUEST_NULL, MPI.INFO_NULL, MPI.ERRHANDLER_NULL, MPI.SESSION_NULL, MPI.GROUP_NULL,
         MPI.WIN_NULL, MPI.OP_NULL, MPI.FILE_NULL, MPI.MESSAGE_NULL, MPI.COMM_NULL]
PREDEFINED = [MPI.INT, MPI.DOUBLE_INT, MPI.INFO_ENV, MPI.SUM, MPI.GROUP_EMPTY, MPI.ERRORS_RETURN, MPI.MESSAGE_NO_PROC,
              MPI.COMM_SELF, MPI.COMM_WORLD]


@pytest.mark.parametrize("obj", NULLS + PREDEFINED + [MPI.Grequest(MPI.REQUEST_NULL), MPI.Prequest(MPI.REQUEST_NULL)])
def test_handles_name_their_object_and_are_not_hashable(obj):
    number = obj.handle
    assert number >= 0 and (number == 0) == (not obj)
    again = type(obj).fromhandle(number)
    assert type(again) is type(obj) and again == obj and again is not obj and again.handle == number
    with pytest.raises(AttributeError):
        again.handle = number
    with pytest.raises(TypeError):
        hash(obj)
    assert MPI._handleof(obj) == number and ctypes.c_uint64.from_address(MPI._addressof(obj)).value == number
    assert MPI._sizeof(obj) == MPI._sizeof(type(obj)) == 8
    with pytest.raises(TypeError):
        type(obj)(1234)


def test_fromhandle_refuses_a_number_no_live_handle_has():
    with pytest.raises(ValueError):
        MPI.Comm.fromhandle(12345)
    assert MPI._sizeof(MPI.Status()) == MPI._sizeof(MPI.Status) > 0
    with pytest.raises(TypeError):
        MPI._sizeof(None)
    with pytest.raises(TypeError):
        MPI._handleof(None)


@pytest.mark.parametrize("obj", PREDEFINED)
def test_free_leaves_predefined_objects_and_nulls_other_handles_of_them(obj):
    for _ in range(2):
        obj.free()
        assert obj
    if not isinstance(obj, MPI.Errhandler):
        other = type(obj)(obj)
        other.free()
        assert not other and obj
    if hasattr(obj, "Dup"):
        dup = obj.Dup()
        assert dup
        dup.free()
        dup.free()
        assert not dup and obj


def test_free_releases_created_objects():
    made = [MPI.COMM_SELF.Isend((None, 0, MPI.BYTE), MPI.PROC_NULL), MPI.Op.Create(lambda *_: None),
            MPI.COMM_SELF.Get_group(), MPI.COMM_SELF.Get_errhandler(), MPI.Info.Create(),
            MPI.INT.Create_vector(2, 1, 3)]
    for obj in made:
        assert obj
        obj.free()
        obj.free()
        assert not obj
    for null in NULLS:
        null.free()
        assert not null


@pytest.mark.parametrize("obj", [MPI.Status()] + NULLS)
def test_pickles_and_copies_keep_the_class_and_give_back_constants(obj):
    cls = type(f"My{type(obj).__name__}", (type(obj),), {})
    globals()[cls.__name__] = cls  # pickle finds the subclass by name
    try:
        for copier in (copy.copy, copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))):
            same = copier(obj)
            assert type(same) is type(obj) and (same is not obj if isinstance(obj, MPI.Status) else same is obj)
            sub = copier(cls(obj))
            assert type(sub) is cls and sub == obj
    finally:
        del globals()[cls.__name__]


@pytest.mark.parametrize("name,address", [("BOTTOM", 0), ("IN_PLACE", 1), ("BUFFER_AUTOMATIC", 0)])
def test_address_constants_are_numbers_with_an_empty_buffer(name, address):
    constant = getattr(MPI, name)
    assert constant == address and int(constant) == operator.index(constant) == address
    assert hash(constant) == hash(address) and bool(constant) == bool(address) and constant != None  # noqa: E711
    assert type(constant)() is constant and repr(constant) == name
    assert pickle.loads(pickle.dumps(constant)) is constant
    view = memoryview(constant)
    assert view.nbytes == 0 and view.obj is None and MPI.Get_address(constant) == address
    with pytest.raises(TypeError):
        constant + 1
