"""``MPI.buffer``, mpi4py's view of raw memory, and the calls that hand memory out or attach it.

A buffer is a stretch of bytes (``address``, ``nbytes``, ``readonly``) and the object that owns them
(``obj``). It takes any buffer-protocol object, a DLPack array or a CUDA array interface, and offers
the buffer protocol itself (``memoryview(buf)``: format ``B``, one dimension), on Python 3.11 too
through a small compiled base class that serves ``__buffer__``. Memory an accelerator owns (DLPack on a device, the
CUDA array interface) may be handed to communication but not read from Python here: ``buf[i]``, ``tobytes``,
``cast`` and ``memoryview`` raise ``BufferError`` for it. ``release()`` (and ``Free_mem``) leave an
empty buffer of address 0.

Buffered sends (``Bsend``) never wait in an attached buffer here, since every send already returns
once its bytes are handed on; ``Attach_buffer``/``Detach_buffer`` keep MPI's contract all the same.
"""

from __future__ import annotations

import operator

import numpy as np

from ..native import exporter_base
from . import cudaiface, dlpack
from .constants import BUFFER_AUTOMATIC
from .errorcodes import ERR_ARG, ERR_BUFFER, error
from .memregion import CPU, HOST_DEVICES, Region
from .requests import Request

__all__ = ["BSEND_OVERHEAD", "buffer", "Alloc_mem", "Free_mem", "Attach_buffer", "Detach_buffer",
           "Flush_buffer", "Iflush_buffer"]

BSEND_OVERHEAD = 128


_NOTHING = object()


class buffer(exporter_base()):
    """Raw memory as mpi4py shows it; ``buffer()`` is an empty one, ``buffer(obj)`` views ``obj``'s.

    Raises:
        TypeError: ``obj`` offers no memory (not a buffer, DLPack array or CUDA array interface).
    """

    def __init__(self, buf=_NOTHING):
        if buf is _NOTHING:
            self._hold(np.empty(0, np.uint8), None, 0, CPU)
        else:
            self._hold(*_memory_of(buf))

    def _hold(self, data: np.ndarray, obj, address: int, device: int) -> None:
        self._bytes, self.obj, self._address, self._device = data, obj, address, device

    @classmethod
    def allocate(cls, nbytes: int, clear: bool = False) -> buffer:
        """``nbytes`` bytes of fresh memory (zeroed: ``clear`` is always honoured)."""
        size = operator.index(nbytes)
        if size < 0:
            raise ValueError(f"expecting non-negative size, got {size}")
        return cls(bytearray(size))

    @classmethod
    def frombuffer(cls, obj, readonly: bool = False) -> buffer:
        """A buffer over the memory of ``obj`` (read-only if ``readonly``)."""
        made = cls(obj)
        return made.toreadonly() if readonly else made

    @classmethod
    def fromaddress(cls, address: int, nbytes: int, readonly: bool = False) -> buffer:
        """A buffer over ``nbytes`` bytes at ``address`` (memory the caller keeps alive)."""
        address, size = operator.index(address), operator.index(nbytes)
        if size < 0:
            raise ValueError(f"expecting non-negative buffer length, got {size}")
        if not address and size:
            raise ValueError("expecting non-NULL address")
        region = Region(address, size, np.dtype(np.uint8), bool(readonly), CPU, None)
        made = cls()
        made._hold(region.array() if size else np.empty(0, np.uint8), None, address, CPU)
        return made

    address = property(lambda self: self._address)
    nbytes = property(lambda self: self._bytes.size)
    readonly = property(lambda self: not self._bytes.flags.writeable)
    format = property(lambda self: "B")
    itemsize = property(lambda self: 1)

    def __len__(self) -> int:
        return self._bytes.size

    def __buffer__(self, flags: int) -> memoryview:
        """What the buffer protocol exports (Python 3.12's hook, which the compiled base serves on 3.11)."""
        return memoryview(self._host())

    def mpi_view(self) -> np.ndarray:
        """The bytes as a numpy array (what communication reads and writes)."""
        return self._bytes

    def _host(self) -> np.ndarray:
        if self._device not in HOST_DEVICES:
            raise BufferError(f"buffer of device memory (DLPack device type {self._device}) cannot be read here")
        return self._bytes

    def __getitem__(self, item):
        data = self._host()
        if isinstance(item, slice):
            start, stop = _span(item, data.size)
            made = buffer()
            made._hold(data[start:stop], self.obj, self._address + start, self._device)
            return made
        return int(data[_index(item, data.size)])

    def __setitem__(self, item, value) -> None:
        data = self._host()
        if self.readonly:
            raise TypeError("buffer is read-only")
        if isinstance(item, slice):
            start, stop = _span(item, data.size)
            if isinstance(value, (int, np.integer)):
                data[start:stop] = value
                return
            source = _memory_of(value)[0]
            if source.size != stop - start:
                raise ValueError(f"cannot assign {source.size} bytes to a slice of {stop - start}")
            data[start:stop] = source
            return
        data[_index(item, data.size)] = value

    def __delitem__(self, item) -> None:
        raise NotImplementedError("a buffer's length is fixed")

    def tobytes(self, order=None) -> bytes:
        return self._host().tobytes()

    def toreadonly(self) -> buffer:
        """Another buffer over the same memory that refuses writes."""
        made = buffer()
        view = self._bytes.view()
        view.flags.writeable = False
        made._hold(view, self.obj, self._address, self._device)
        return made

    def cast(self, format: str, shape=None) -> memoryview:
        view = memoryview(self._host())
        return view.cast(format) if shape is None else view.cast(format, shape)

    def release(self) -> None:
        self._hold(np.empty(0, np.uint8), None, 0, CPU)


def _memory_of(obj) -> tuple[np.ndarray, object, int, int]:
    """``(bytes, owner, address, device)`` of anything a buffer may view."""
    if isinstance(obj, buffer):
        return obj._bytes, obj.obj, obj._address, obj._device
    if hasattr(obj, "__dlpack__") and not _long_doubles(obj):
        region = dlpack.region(obj)
    elif hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__array_interface__"):
        region = cudaiface.region(obj)
    else:
        try:
            data = np.frombuffer(memoryview(obj), np.uint8)
        except TypeError:
            raise TypeError(f"expecting buffer-like object, got {type(obj).__name__!r}") from None
        return data, obj, data.ctypes.data, CPU
    data = region.array().view(np.uint8) if region.nbytes else np.empty(0, np.uint8)
    if region.readonly:
        data.flags.writeable = False
    return data, obj, region.address, region.device


def _long_doubles(obj) -> bool:
    """Whether ``obj`` is a numpy array of long doubles, which numpy exports through its buffer protocol
    alone (DLPack has no such type)."""
    return isinstance(obj, np.ndarray) and obj.dtype.type in (np.longdouble, np.clongdouble)


def _index(item, size: int) -> int:
    if not isinstance(item, (int, np.integer)):
        raise TypeError(f"buffer indices must be integers or slices, not {type(item).__name__}")
    index = int(item) + size if item < 0 else int(item)
    if not 0 <= index < size:
        raise IndexError(f"buffer index {item} out of range for {size} bytes")
    return index


def _span(item: slice, size: int) -> tuple[int, int]:
    start, stop, step = item.indices(size)
    if step != 1:
        raise IndexError("buffer slices take no step")
    return start, max(start, stop)


_attached: list = []


def Alloc_mem(size: int, info=None) -> buffer:
    """``size`` bytes of memory for communication, as a :class:`buffer` (``Free_mem`` releases it)."""
    if int(size) < 0:
        raise error(ERR_ARG, f"Alloc_mem size must be >= 0, got {size}")
    return buffer.allocate(int(size))


def Free_mem(mem: buffer) -> None:
    mem.release()


def Attach_buffer(buf) -> None:
    """Attach a buffer for buffered sends (one at a time, as MPI says).

    Raises:
        BufferError: ``buf`` is read-only.
        MPI.Exception: ``ERR_BUFFER``, a buffer is attached already.
    """
    memory = buf if isinstance(buf, buffer) or buf is None else buffer(buf)
    if memory is not None and memory.readonly:
        raise BufferError("the buffer attached for buffered sends must be writable")
    if _attached:
        raise error(ERR_BUFFER, "a buffer is already attached; Detach_buffer() it first")
    _attached.append(memory)


def Detach_buffer():
    """The buffer :func:`Attach_buffer` attached, now detached."""
    if not _attached:
        raise error(ERR_BUFFER, "no buffer is attached")
    got = _attached.pop()
    return BUFFER_AUTOMATIC if got is None else got


def Flush_buffer() -> None:
    """Buffered sends here never wait in the attached buffer: there is nothing to flush."""


def Iflush_buffer():
    return Request()
