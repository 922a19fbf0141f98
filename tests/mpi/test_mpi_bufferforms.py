"""Every memory form allreduce.MPI takes as a buffer argument, and the errors of each as mpi4py
raises them, in one process (``COMM_SELF``), against numpy: numpy arrays in either order and byte
order, the CUDA array interface over host memory, DLPack tensors whose description a test edits,
counts given as numpy integers, and reductions whose two buffers disagree."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

from allreduce import MPI


@pytest.fixture(autouse=True, scope="module")
def world_of_one():
    yield
    MPI.Finalize()


def sendrecv(send, recv):
    MPI.COMM_SELF.Sendrecv(send, 0, 0, recv, 0, 0)


def test_numpy_arrays_move_in_memory_order_whatever_their_layout():
    send = np.arange(6.0).reshape(3, 2).T  # Fortran order
    got = np.zeros((3, 2)).T
    sendrecv(send, got)
    assert np.array_equal(got, send)
    with pytest.raises(BufferError, match="not contiguous"):
        sendrecv(np.arange(6.0).reshape(3, 2)[:, 0], np.zeros(3))
    with pytest.raises(BufferError, match="read-only"):
        sendrecv(np.ones(3), np.frombuffer(bytes(24)))


def test_another_byte_order_needs_a_datatype_to_move_its_bytes():
    foreign = ">i4" if sys.byteorder == "little" else "<i4"
    send, got = np.arange(3, dtype=foreign), np.zeros(3, foreign)
    with pytest.raises(BufferError, match="byte order"):
        sendrecv(send, got)
    sendrecv([send, MPI.INT], [got, MPI.INT])
    assert got.tolist() == [0, 1, 2]


def test_an_explicit_count_may_leave_bytes_over_but_a_whole_buffer_may_not():
    raw = MPI.Alloc_mem(5)
    raw[0:4] = np.int32(7).tobytes()
    got = np.zeros(1, np.int32)
    sendrecv([raw, 1, "i"], got)
    assert got[0] == 7
    with pytest.raises(ValueError, match="whole number"):
        sendrecv([raw, "i"], got)
    for bad, error in (([raw, 0, "\0"], KeyError), ([raw, 0, 1, MPI.DATATYPE_NULL], ValueError),
                       ([raw, 0, 0, "i", None], ValueError), ([raw, -1, "i"], ValueError)):
        with pytest.raises(error):
            sendrecv(bad, [None, 0, "B"])
    sendrecv([None, 0, "B"], [None, 0, "B"])  # nothing was left posted by the refusals


def test_counts_and_displacements_are_integers_numpy_ones_too():
    send, got = bytearray(b"abc"), bytearray(4)
    MPI.COMM_SELF.Alltoallv([send, np.array([3])], [got, (3, np.array([1]))])
    assert got == bytearray(b"\0abc")
    got = bytearray(3)
    MPI.COMM_SELF.Alltoallv([bytearray(b"xabc"), (3, [np.array(1)])], [got, np.array(3)])
    assert got == bytearray(b"abc")
    with pytest.raises(TypeError):
        MPI.COMM_SELF.Alltoallv([send, np.array([3.0])], [bytearray(4), (3, [1])])


class HostCAI:
    """An accelerator's array interface over host memory, which a test then edits."""

    def __init__(self, values, readonly: bool = False):
        self.memory = np.array(values, np.int32)
        self.__cuda_array_interface__ = {"version": 3, "data": (self.memory.ctypes.data, readonly),
                                         "typestr": self.memory.dtype.str, "shape": (self.memory.size, 1, 1),
                                         "strides": (4, 4, 4), "descr": [("", self.memory.dtype.str)]}


def test_the_cuda_array_interface_is_read_as_mpi4py_reads_it():
    send, got = HostCAI([1, 2, 3]), HostCAI([0, 0, 0])
    got.__cuda_array_interface__["strides"] = (4, 0, 7)  # axes of extent 1: any stride
    sendrecv(send, got)
    assert got.memory.tolist() == [1, 2, 3]
    edits = [("strides", (8, 4, 4), BufferError), ("mask", True, BufferError), ("shape", (3, -1), BufferError),
             ("typestr", (">" if sys.byteorder == "little" else "<") + "i4", BufferError),
             ("typestr", "<iX", ValueError), ("typestr", 42, TypeError), ("shape", None, TypeError),
             ("data", (got.memory.ctypes.data,), ValueError), ("data", None, TypeError), ("descr", 42, TypeError)]
    for key, value, error in edits:
        target = HostCAI([0, 0, 0])
        target.__cuda_array_interface__[key] = value
        with pytest.raises(error):
            sendrecv(send, target)
    with pytest.raises(KeyError):
        target = HostCAI([0, 0, 0])
        del target.__cuda_array_interface__["typestr"]
        sendrecv(send, target)
    with pytest.raises(BufferError, match="read-only"):
        sendrecv(send, HostCAI([0, 0, 0], readonly=True))


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("tensor", _Tensor)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class EditableDLPack:
    """A DLPack producer over a numpy array whose tensor description a test may edit (versioned, 1.0)."""

    def __init__(self, values, dtype=np.int32):
        self.memory = np.array(values, dtype)
        self.shape = (ctypes.c_int64 * 3)(self.memory.size, 1, 1)
        self.strides = (ctypes.c_int64 * 3)(1, 1, 1)
        self.managed = _Versioned(major=1, minor=0)
        tensor = self.managed.tensor
        tensor.data, tensor.device = self.memory.ctypes.data, _Device(1, 0)
        tensor.ndim, tensor.shape, tensor.strides = 1, self.shape, self.strides
        tensor.code, tensor.bits, tensor.lanes = {"i": 0, "u": 1}[self.memory.dtype.kind], 8 * self.memory.itemsize, 1

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return _new_capsule(ctypes.addressof(self.managed), b"dltensor_versioned", None)

    def __dlpack_device__(self):
        return (1, 0)


def test_dlpack_tensors_are_read_as_mpi4py_reads_them():
    send, got = EditableDLPack([1, 2, 3, 4]), EditableDLPack([0, 0, 0, 0])
    send.managed.tensor.code, got.managed.tensor.bits, got.managed.tensor.lanes = 3, 16, 2  # opaque, 2 lanes: bytes
    sendrecv(send, got)
    assert got.memory.tolist() == [1, 2, 3, 4]
    got = EditableDLPack([0] * 4, np.uint8)
    got.managed.tensor.byte_offset = 1
    assert MPI.buffer(got)[0] == 0 and MPI.Get_address(got) == got.memory.ctypes.data + 1
    square = EditableDLPack(range(4))
    square.managed.tensor.ndim = 2
    square.shape[0], square.shape[1] = 2, 2
    for strides, fine in (((2, 1), True), ((1, 2), True), ((1, 1), False), ((-1, 1), False)):
        square.strides[0], square.strides[1] = strides
        if fine:
            MPI.Get_address(square)
        else:
            with pytest.raises(BufferError, match="not contiguous"):
                MPI.Get_address(square)


@pytest.mark.skipif(np.dtype(np.longdouble) == np.dtype(np.float64), reason="long double is double here")
def test_two_lanes_of_floats_are_a_complex_as_mpi4py_reads_them():
    """DLPack has no code for long double's complex: a producer describes it as two float lanes."""
    values = (np.arange(3) + 1j * np.arange(3, 6)).astype(np.clongdouble)
    tensor = EditableDLPack(values.view(np.uint8), np.uint8)
    tensor.shape[0] = 3
    described = tensor.managed.tensor
    described.code, described.bits, described.lanes = 2, 8 * np.dtype("g").itemsize, 2
    got = np.zeros(3, np.clongdouble)
    MPI.COMM_SELF.Allreduce(tensor, got, MPI.SUM)  # datatypes of both buffers must match
    assert np.array_equal(got, values)
    cai = HostCAI([0])  # over memory of three long double complexes ("<c32")
    cai.memory = values.copy()
    cai.__cuda_array_interface__ = {"version": 3, "data": (cai.memory.ctypes.data, False),
                                    "typestr": values.dtype.str, "shape": (3,)}
    got[:] = 0
    MPI.COMM_SELF.Allreduce(cai, got, MPI.SUM)
    assert np.array_equal(got, values)


def test_malformed_dlpack_descriptions_raise_buffer_errors():
    def edited(edit):
        made = EditableDLPack([1, 2])
        edit(made)
        return made
    for edit in (lambda m: setattr(m.managed, "major", 0), lambda m: setattr(m.managed.tensor, "ndim", -1),
                 lambda m: m.shape.__setitem__(0, -2), lambda m: setattr(m, "__dlpack__", lambda **kw: None)):
        with pytest.raises(BufferError):
            MPI.Get_address(edited(edit))
    readonly = edited(lambda m: setattr(m.managed, "flags", 1))
    MPI.Get_address(readonly)  # read-only is fine to send
    with pytest.raises(BufferError, match="read-only"):
        sendrecv(EditableDLPack([1, 2]), readonly)
    for device, error in ((lambda: None, TypeError), (lambda: (1,), ValueError), (lambda: (1, None), TypeError)):
        with pytest.raises(error):
            MPI.Get_address(edited(lambda m: setattr(m, "__dlpack_device__", device)))  # noqa: B023 - called within this iteration


def test_one_capsule_is_read_as_often_as_it_lives_and_a_used_one_is_refused():
    source = np.arange(3.0)
    capsule = source.__dlpack__()

    class SameCapsule:
        def __dlpack__(self, **kwargs):
            return capsule
    MPI.Get_address(SameCapsule())
    assert MPI.Get_address(SameCapsule()) == source.ctypes.data
    np.from_dlpack(type("Once", (), {"__dlpack__": lambda self, **kw: capsule,
                                     "__dlpack_device__": lambda self: (1, 0)})())  # numpy consumes it
    with pytest.raises(BufferError, match="used"):
        MPI.Get_address(SameCapsule())


@pytest.mark.parametrize("call", ["Allreduce", "Reduce", "Reduce_scatter_block", "Scan", "Exscan"])
def test_reductions_refuse_send_and_receive_buffers_of_different_datatypes(call):
    send, got = np.arange(2, dtype=np.int32), np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="datatypes"):
        getattr(MPI.COMM_SELF, call)([send, MPI.INT], [got, MPI.FLOAT])
    with pytest.raises(ValueError, match="datatypes"):
        MPI.COMM_SELF.Reduce_scatter([send, MPI.INT], [got, MPI.FLOAT], [2])
    same = np.zeros(2, np.int32)
    MPI.COMM_SELF.Allreduce(send, same)
    assert same.tolist() == [0, 1]


def test_a_null_pointer_is_refused_unless_it_holds_nothing():
    empty = EditableDLPack([], np.int32)
    empty.managed.tensor.data, empty.shape[0] = None, 0
    assert MPI.buffer(empty).nbytes == 0
    null = EditableDLPack([1, 2], np.int32)
    null.managed.tensor.data = None
    with pytest.raises(BufferError, match="NULL"):
        sendrecv(null, np.zeros(2, np.int32))
