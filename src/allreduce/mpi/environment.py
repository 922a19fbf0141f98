"""The MPI environment: versions, thread levels, clocks, and its constants.

``Get_version`` answers 3.1, the MPI standard whose intra-communicator surface this module offers;
``get_vendor`` names this library. Memory (``MPI.buffer``, ``Alloc_mem``, attached buffers) is in
:mod:`.memory`.
"""

from __future__ import annotations

import socket
import threading
import time

from ..version import __version__ as _version
from .derived import DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_DFLT_DARG, DISTRIBUTE_NONE  # noqa: F401
from .errorcodes import ERR_ARG, error

THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
VERSION, SUBVERSION = 3, 1
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
