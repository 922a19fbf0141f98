"""The MPI environment: versions, thread levels, memory and buffer objects, and its constants.

``Get_version`` answers 3.1, the MPI standard whose intra-communicator surface this module offers;
``get_vendor`` names this library. ``MPI.buffer`` is mpi4py's view of raw memory (``Alloc_mem``
returns one); buffered sends (``Bsend``) need no attached buffer here, since every send already
returns once its bytes are handed on, but ``Attach_buffer``/``Detach_buffer`` keep MPI's contract.
"""

from __future__ import annotations

import ctypes
import socket
import threading
import time

import numpy as np

from .. import __version__ as _version
from .. import native
from .derived import DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_DFLT_DARG, DISTRIBUTE_NONE  # noqa: F401
from .errorcodes import ERR_ARG, ERR_BUFFER, error

THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
VERSION, SUBVERSION = 3, 1
BSEND_OVERHEAD = 128
KEYVAL_INVALID = -1
TAG_UB, IO, WTIME_IS_GLOBAL, APPNUM, LASTUSEDCODE, UNIVERSE_SIZE = 0, 2, 3, 4, 5, 6  # attribute keys of a Comm
MAX_PROCESSOR_NAME, MAX_ERROR_STRING, MAX_LIBRARY_VERSION_STRING, MAX_OBJECT_NAME = 256, 256, 256, 64
ORDER_C, ORDER_F, ORDER_FORTRAN = 0, 1, 1
COMM_TYPE_SHARED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_HW_GUIDED, COMM_TYPE_RESOURCE_GUIDED = 0, 12, 13, -32766
ROOT = -4
_main_thread = threading.main_thread()
_finalized: list[bool] = []


def Get_version() -> tuple[int, int]:
    return VERSION, SUBVERSION


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    """``("allreduce", (major, minor, micro))``: this library stands where the MPI library would."""
    numbers = [int(part) for part in _version.split("+")[0].split(".")[:3] if part.isdigit()]
    return "allreduce", tuple((numbers + [0, 0, 0])[:3])


def Get_library_version() -> str:
    return f"allreduce {_version} (MPI {VERSION}.{SUBVERSION} intra-communicators over its own transports)"


def Get_processor_name() -> str:
    return socket.gethostname()


def Query_thread() -> int:
    """``THREAD_MULTIPLE``: every call may come from any thread."""
    return THREAD_MULTIPLE


def Is_thread_main() -> bool:
    return threading.current_thread() is _main_thread


def Is_finalized() -> bool:
    return bool(_finalized)


def mark_finalized() -> None:
    """``MPI.Finalize`` has run."""
    _finalized.append(True)


def Wtime() -> float:
    """Seconds on a monotonic clock: for measuring intervals, like ``MPI_Wtime``."""
    return time.perf_counter()


def Wtick() -> float:
    """The resolution of :func:`Wtime`, in seconds."""
    return time.get_clock_info("perf_counter").resolution


def Pcontrol(level: int) -> None:
    """Profiling control: accepted and, as MPI allows when no profiler listens, ignored."""
    if int(level) < 0:
        raise error(ERR_ARG, f"Pcontrol level must be >= 0, got {level}")


class buffer(native.exporter_base()):  # noqa: N801 - mpi4py's name
    """Raw memory as mpi4py shows it: bytes with an ``address``, the object that owns them, and the
    buffer protocol (one-dimensional, format ``B``)."""

    def __init__(self, buf=None):
        if buf is None:
            self._view, self.obj = memoryview(bytearray()), None
            return
        try:
            self._view = memoryview(buf).cast("B")
        except TypeError:
            raise TypeError(f"a bytes-like object is required, not {type(buf).__name__!r}") from None
        self.obj = buf

    @classmethod
    def allocate(cls, nbytes: int, clear: bool = False) -> "buffer":
        if int(nbytes) < 0:
            raise ValueError(f"expecting non-negative size, got {nbytes}")
        return cls(bytearray(int(nbytes)))

    @classmethod
    def frombuffer(cls, obj, readonly: bool = False) -> "buffer":
        made = cls(obj)
        if readonly:
            made._view = made._view.toreadonly()
        return made

    @classmethod
    def fromaddress(cls, address: int, nbytes: int, readonly: bool = False) -> "buffer":
        if int(nbytes) < 0:
            raise ValueError(f"expecting non-negative buffer length, got {nbytes}")
        if not address and nbytes:
            raise ValueError("expecting non-NULL address")
        raw = (ctypes.c_char * int(nbytes)).from_address(int(address)) if nbytes else bytearray()
        made = cls(raw)
        if readonly:
            made._view = made._view.toreadonly()
        return made

    @property
    def address(self) -> int:
        if not self._view.nbytes:
            return 0
        return np.frombuffer(self._view, np.uint8).__array_interface__["data"][0]

    nbytes = property(lambda self: self._view.nbytes)
    readonly = property(lambda self: self._view.readonly)
    format = property(lambda self: "B")
    itemsize = property(lambda self: 1)

    def __len__(self) -> int:
        return self._view.nbytes

    def __buffer__(self, flags: int) -> memoryview:
        return self._view

    def mpi_view(self) -> np.ndarray:
        """The bytes as a numpy array (what communication reads and writes)."""
        return np.frombuffer(self._view, np.uint8) if self._view.nbytes else np.empty(0, np.uint8)

    def __getitem__(self, item):
        got = self._view[item]
        return buffer(got) if isinstance(item, slice) else got

    def __setitem__(self, item, value) -> None:
        if self._view.readonly:
            raise TypeError("buffer is read-only")
        if isinstance(item, slice) and isinstance(value, int):
            np.frombuffer(self._view, np.uint8)[item] = value
        else:
            self._view[item] = memoryview(value).cast("B") if isinstance(item, slice) else value

    def tobytes(self, order=None) -> bytes:
        return self._view.tobytes()

    def toreadonly(self) -> "buffer":
        made = buffer(self.obj if self.obj is not None else bytearray())
        made._view = self._view.toreadonly()
        return made

    def cast(self, format: str, shape=None) -> memoryview:  # noqa: A002 - memoryview's name
        return self._view.cast(format) if shape is None else self._view.cast(format, shape)

    def release(self) -> None:
        self._view.release()
        self._view, self.obj = memoryview(bytearray()), None


_attached: list = []


def Alloc_mem(size: int, info=None) -> buffer:
    """``size`` bytes of memory for communication, as a :class:`buffer` (``Free_mem`` releases it)."""
    if int(size) < 0:
        raise error(ERR_ARG, f"Alloc_mem size must be >= 0, got {size}")
    return buffer.allocate(int(size))


def Free_mem(mem: buffer) -> None:
    mem.release()


def Attach_buffer(buf) -> None:
    """Attach a buffer for buffered sends (one at a time, as MPI says)."""
    if _attached:
        raise error(ERR_BUFFER, "a buffer is already attached; Detach_buffer() it first")
    _attached.append(buf)


def Detach_buffer():
    """The buffer :func:`Attach_buffer` attached, now detached."""
    if not _attached:
        raise error(ERR_BUFFER, "no buffer is attached")
    got = _attached.pop()
    if got is None:
        from .constants import BUFFER_AUTOMATIC
        return BUFFER_AUTOMATIC
    return got


def Flush_buffer() -> None:
    """Buffered sends here never wait in the attached buffer: there is nothing to flush."""


def Iflush_buffer():
    from .requests import Request
    return Request()
