"""``MPI.__pyx_capi__``, mpi4py's C API, called through ctypes as a C extension would: for each handle
class, ``PyMPI<Class>_Get`` gives the address of the object's MPI handle (``MPI._addressof``, where
its number lies) and ``PyMPI<Class>_New`` of that number makes another object of the same class equal
to it; a Status's functions take and give the address of its fields."""

from __future__ import annotations

import ctypes

import pytest

from allreduce import MPI

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_pointer.restype = ctypes.c_void_p


@pytest.fixture(autouse=True, scope="module")
def world_of_one():
    yield
    MPI.Finalize()


def _function(name: str, signature: str, functype):
    """The C function of capsule ``name``, read as a C caller reads it (by its signature)."""
    return functype(_get_pointer(MPI.__pyx_capi__[name], signature.encode()))


HANDLES = [MPI.DATATYPE_NULL, MPI.INT, MPI.DOUBLE_INT, MPI.REQUEST_NULL, MPI.INFO_NULL, MPI.INFO_ENV, MPI.OP_NULL,
           MPI.SUM, MPI.MAX, MPI.ERRHANDLER_NULL, MPI.ERRORS_RETURN, MPI.GROUP_NULL, MPI.GROUP_EMPTY,
           MPI.MESSAGE_NULL, MPI.MESSAGE_NO_PROC, MPI.SESSION_NULL, MPI.WIN_NULL, MPI.FILE_NULL, MPI.COMM_NULL,
           MPI.COMM_SELF, MPI.COMM_WORLD]


@pytest.mark.parametrize("obj", HANDLES, ids=repr)
def test_get_gives_where_the_handle_lies_and_new_makes_an_equal_one(obj):
    name = "Comm" if isinstance(obj, MPI.Comm) else type(obj).__name__
    get = _function(f"PyMPI{name}_Get", f"MPI_{name} *(PyObject *)", ctypes.PYFUNCTYPE(ctypes.c_void_p,
                                                                                        ctypes.py_object))
    new = _function(f"PyMPI{name}_New", f"PyObject *(MPI_{name})", ctypes.PYFUNCTYPE(ctypes.py_object,
                                                                                      ctypes.c_uint64))
    address = get(obj)
    assert address == MPI._addressof(obj) and ctypes.c_uint64.from_address(address).value == obj.handle
    again = new(obj.handle)
    assert type(again) is type(obj) and again == obj and again is not obj


def test_a_status_travels_as_the_address_of_its_fields():
    get = _function("PyMPIStatus_Get", "MPI_Status *(PyObject *)", ctypes.PYFUNCTYPE(ctypes.c_void_p,
                                                                                      ctypes.py_object))
    new = _function("PyMPIStatus_New", "PyObject *(MPI_Status *)", ctypes.PYFUNCTYPE(ctypes.py_object,
                                                                                      ctypes.c_void_p))
    status = MPI.Status()
    status.source, status.tag, status.error = 3, 17, MPI.ERR_OTHER
    address = get(status)
    assert address == MPI._addressof(status) == MPI._handleof(status)
    copy = new(address)
    assert type(copy) is MPI.Status and copy == status and copy is not status
    assert (copy.source, copy.tag, copy.error) == (3, 17, MPI.ERR_OTHER)
    assert new(None) == MPI.Status()  # NULL: an empty status


def test_every_capsule_is_named_by_its_signature():
    for name, capsule in MPI.__pyx_capi__.items():
        klass = name[len("PyMPI"):].rsplit("_", 1)[0]
        handle = "Request" if klass in ("Prequest", "Grequest") else klass
        star = " *" if klass == "Status" else ""
        signature = f"PyObject *(MPI_{handle}{star})" if name.endswith("_New") else f"MPI_{klass} *(PyObject *)"
        assert _get_pointer(capsule, signature.encode())
    assert {"PyMPIDatatype_New", "PyMPIComm_Get", "PyMPIStatus_New", "PyMPIGrequest_New"} <= set(MPI.__pyx_capi__)
