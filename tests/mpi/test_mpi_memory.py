"""allreduce.MPI's raw memory, in one process: ``MPI.buffer`` over every kind of memory it takes,
the buffer protocol it offers, its sequence rules, and the buffer attached for buffered sends."""

from __future__ import annotations

import array
import sys

import numpy as np
import pytest

from allreduce import MPI
from allreduce.native import load

EXPORTS = sys.version_info >= (3, 12) or load("exporter")[0] is not None  # the buffer protocol from Python


@pytest.fixture(autouse=True, scope="module")
def world_of_one():
    yield
    MPI.Finalize()


@pytest.mark.skipif(not EXPORTS, reason="Python 3.11 without the compiled extensions")
def test_a_buffer_exports_its_bytes_to_memoryview_and_numpy():
    owner = array.array("i", [1, 2, 3])
    buf = MPI.buffer.frombuffer(owner)
    view = memoryview(buf)
    assert (view.format, view.ndim, view.shape, view.readonly) == ("B", 1, (12,), False)
    assert buf.address == owner.buffer_info()[0] and buf.obj is owner
    np.frombuffer(buf, np.int32)[:] = [7, 8, 9]  # writes go to the owner's memory
    assert owner.tolist() == [7, 8, 9]
    assert memoryview(MPI.buffer(b"ab")).readonly and memoryview(MPI.buffer()).nbytes == 0


def test_a_buffer_over_an_address_reads_and_writes_there():
    owner = bytearray(b"\x01\x02\x03")
    base = np.frombuffer(owner, np.uint8).ctypes.data
    buf = MPI.buffer.fromaddress(base, 3)
    buf[1:] = b"xy"
    assert owner == bytearray(b"\x01xy") and buf.tobytes() == b"\x01xy"
    assert buf.toreadonly().readonly and buf.toreadonly().address == base
    for bad in ((base, -1), (0, 1)):
        with pytest.raises(ValueError):
            MPI.buffer.fromaddress(*bad)
    buf.release()
    assert (buf.address, buf.nbytes, buf.obj) == (0, 0, None)


def test_a_buffer_indexes_as_mpi4pys():
    n = 8
    mem = MPI.Alloc_mem(n)
    assert type(mem) is MPI.buffer and mem.address != 0 and mem.nbytes == n
    for i in range(-n, 0):
        mem[i] = -i
    assert [mem[i] for i in range(n)] == list(range(n, 0, -1))
    mem[:] = 0
    mem[2:4] = b"ab"
    assert mem.tobytes() == b"\0\0ab\0\0\0\0" and mem[2:4].tobytes() == b"ab"
    for bad, error in ((n, IndexError), (slice(None, None, 2), IndexError), (None, TypeError)):
        with pytest.raises(error):
            mem[bad]
        with pytest.raises(error):
            mem[bad] = 0
    with pytest.raises(ValueError):
        mem[0:1] = b"xyz"
    with pytest.raises(NotImplementedError):
        del mem[0]
    with pytest.raises(TypeError):
        MPI.buffer(b"ro")[0] = 1
    MPI.Free_mem(mem)
    assert mem.address == 0 and mem.nbytes == 0


def test_allocate_gives_memory_even_of_no_bytes_and_refuses_bad_sizes():
    for size in (0, 1, 5):
        buf = MPI.buffer.allocate(size)
        assert buf.nbytes == size and buf.address != 0 and memoryview(buf.obj).nbytes == size
    with pytest.raises(TypeError):
        MPI.buffer.allocate(None)
    with pytest.raises(ValueError):
        MPI.buffer.allocate(-1)
    for bad in (None, 0, 0.0, [], ()):
        with pytest.raises(TypeError):
            MPI.buffer(bad)
        with pytest.raises(TypeError):
            MPI.buffer.frombuffer(bad)


def test_device_memory_moves_but_is_not_read_here():
    host = np.arange(4, dtype=np.int32)

    class FakeDevice:  # an accelerator's array interface over memory the host can in fact read
        __cuda_array_interface__ = {"version": 3, "data": (host.ctypes.data, False), "typestr": "<i4",
                                    "shape": (4,), "strides": None}

    buf = MPI.buffer.frombuffer(FakeDevice())
    assert buf.address == host.ctypes.data and buf.nbytes == 16
    for touch in (lambda: buf[0], lambda: buf.tobytes(), lambda: buf.cast("i"), *[lambda: memoryview(buf)] * EXPORTS):
        with pytest.raises(BufferError):
            touch()
    got = np.zeros(4, np.int32)
    MPI.COMM_SELF.Sendrecv(buf, 0, 0, got, 0, 0)
    assert got.tolist() == host.tolist()


def test_attach_takes_one_writable_buffer_and_detach_gives_it_back():
    with pytest.raises(BufferError):
        MPI.Attach_buffer(MPI.buffer(b"read-only"))
    memory = MPI.Alloc_mem(1 << 10)
    MPI.Attach_buffer(memory)
    with pytest.raises(MPI.Exception) as caught:
        MPI.Attach_buffer(MPI.Alloc_mem(8))
    assert caught.value.Get_error_class() == MPI.ERR_BUFFER
    MPI.Flush_buffer()
    back = MPI.Detach_buffer()
    assert (back.address, back.nbytes) == (memory.address, memory.nbytes)
    with pytest.raises(MPI.Exception):
        MPI.Detach_buffer()
