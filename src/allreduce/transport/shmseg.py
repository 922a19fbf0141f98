"""Shared memory segments: anonymous memfd files, mapped by their owner and handed to peers as fds.

A segment is a ``memfd_create`` file mapped with ``MAP_SHARED``. It has no name in any file system, so
nothing can be left behind under ``/dev/shm`` whatever happens to the processes: the kernel frees the
memory when the last process that maps it or holds its descriptor is gone, even after ``SIGKILL``.
Peers get the descriptor over a Unix socket (``SCM_RIGHTS``) and map it themselves. memfd memory also
escapes the size limit containers often put on ``/dev/shm``.

*Registered* arrays (:func:`empty`) live in segments of their own, listed in a process-wide registry
by address, so a transport can tell that a send's payload is already shared (:func:`find`) and let the
receiver read it in place: zero copies. Each segment has a *generation* number, unique in this process,
by which peers cache their mappings. A registered segment is released when its array is garbage
collected (the registry holds only weak references); :func:`released` lists them so transports can
tell the peers that mapped one to unmap it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..dtypes import resolve
from ..errors import exhausted

PAGE = mmap.PAGESIZE


def available() -> bool:
    """Whether this platform offers memfd segments (Linux)."""
    return hasattr(os, "memfd_create") and hasattr(mmap, "MAP_SHARED")


@dataclass(eq=False)
class Segment:
    """One mapped memfd: its descriptor, mapping, size, generation and base address."""

    fd: int
    map: mmap.mmap
    size: int
    gen: int
    address: int

    def close(self) -> None:
        """Unmap (if no view is still exported) and close the descriptor."""
        try:
            self.map.close()
        except BufferError:  # a view is still alive; the mapping goes when it does
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_gens = iter(range(1, 1 << 62))
_lock = threading.Lock()


def create(nbytes: int, label: str) -> Segment:
    """A new zero-filled segment of at least ``nbytes`` (rounded up to whole pages)."""
    size = max(PAGE, -(-nbytes // PAGE) * PAGE)
    fd = -1
    try:
        fd = os.memfd_create(f"allreduce-{label}", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        raise exhausted(exc, f"making a {size}-byte shared-memory segment") or exc  # noqa: B904 (the OSError stays its context)
    with _lock:
        gen = next(_gens)
    return Segment(fd, mapped, size, gen, address_of(mapped))


def attach(fd: int, gen: int) -> Segment:
    """Map a peer's segment from a descriptor received over a socket; the descriptor is closed here."""
    try:
        size = os.fstat(fd).st_size
        mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return Segment(-1, mapped, size, gen, address_of(mapped))


# ---- registered arrays -------------------------------------------------------------------------

_registered: dict[int, tuple[weakref.ref, Segment]] = {}  # gen -> (weak ref to the array, segment)
_released: list[int] = []  # generations of registered segments freed so far, in order


def empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialized C-contiguous array in shared memory (a *registered* buffer).

    Collectives on it (or on any contiguous slice of it) over shared memory skip the copy into the
    transport's buffers: peers read it where it lies. It behaves as any other numpy array.

    Raises:
        ValueError: for a negative dimension. OSError: when the memory cannot be allocated.

    Example::

        x = allreduce.empty(1 << 20, np.float32)
        x[:] = rank
        allreduce.all_reduce(x)
    """
    dtype = resolve(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    segment = create(count * dtype.itemsize, "buffer")
    flat = np.frombuffer(segment.map, dtype, count)  # every view of the result keeps this one alive
    with _lock:
        _registered[segment.gen] = (weakref.ref(flat), segment)
    weakref.finalize(flat, _release, segment.gen)
    return flat.reshape(shape)


def find(address: int, nbytes: int) -> tuple[Segment, int] | None:
    """The registered segment holding bytes ``[address, address + nbytes)`` and their offset in it."""
    with _lock:
        entries = list(_registered.values())
    for ref, segment in entries:
        offset = address - segment.address
        if 0 <= offset and offset + nbytes <= segment.size and ref() is not None:
            return segment, offset
    return None


def released_count() -> int:
    """How many registered segments have been freed in this process so far."""
    return len(_released)


def released(since: int) -> list[int]:
    """Generations of registered segments freed since ``len(released(0))`` was ``since``, so peers
    that mapped them can be told to let go."""
    with _lock:
        return _released[since:]


def _release(gen: int) -> None:
    with _lock:
        _, segment = _registered.pop(gen)
        _released.append(gen)
    segment.close()


# ---- addresses ---------------------------------------------------------------------------------

class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]


def address_of(buffer) -> int:
    """The address of the first byte of a contiguous buffer (read-only ones too), in about 2 us."""
    view = _PyBuffer()
    _get_buffer(buffer, ctypes.byref(view), 0)
    try:
        return view.buf or 0
    finally:
        _release_buffer(ctypes.byref(view))
