"""mpi4py's ``MPI`` module on allreduce: change ``from mpi4py import MPI`` to ``from allreduce import MPI``.

The same script then runs under ``allreduce run -n 4 -- python script.py``, ``mpirun``/``mpiexec``
(Open MPI, MPICH) and ``srun``, with no MPI installed: ``COMM_WORLD`` joins the library's default
group on first use (see :mod:`.comm`). What MPI offers and this library has no counterpart for,
one-sided communication, MPI-IO, process topologies, dynamic processes, derived datatypes other
than contiguous, raises ``NotImplementedError`` naming the feature. See docs/mpi.md.
"""

from __future__ import annotations

import socket
import time

from .. import api
from .comm import COMM_NULL, COMM_WORLD, UNDEFINED, Comm, finalize, init_world
from .datatypes import (
    BOOL, BYTE, C_BOOL, C_DOUBLE_COMPLEX, C_FLOAT_COMPLEX, CHAR, COMPLEX, DOUBLE, DOUBLE_COMPLEX, FLOAT, IN_PLACE,
    INT, INT8_T, INT16_T, INT32_T, INT64_T, LONG, LONG_LONG, SHORT, SIGNED_CHAR, UINT8_T, UINT16_T, UINT32_T,
    UINT64_T, UNSIGNED, UNSIGNED_CHAR, UNSIGNED_LONG, UNSIGNED_LONG_LONG, UNSIGNED_SHORT, Datatype,
)
from .reductions import BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, PROD, SUM, Op
from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, Request, Status
from .ulfm import ERR_PROC_FAILED, ERR_PROC_FAILED_PENDING, ERR_REVOKED, Exception, Group

Intracomm = Comm
SUCCESS = 0

_UNSUPPORTED = {  # module attributes of MPI features this library does not offer
    "Win": "one-sided communication (MPI.Win)",
    "File": "MPI-IO (MPI.File)",
    "COMM_SELF": "COMM_SELF (a communicator of one rank; use COMM_WORLD.Split(color=rank))",
    "Cartcomm": "process topologies (MPI.Cartcomm)",
    "Graphcomm": "process topologies (MPI.Graphcomm)",
    "Intercomm": "inter-communicators (MPI.Intercomm)",
    "Open_port": "dynamic process management (MPI.Open_port)",
    "Attach_buffer": "buffered sends (MPI.Attach_buffer)",
}


def __getattr__(name: str):
    if name in _UNSUPPORTED:
        raise NotImplementedError(f"{_UNSUPPORTED[name]} is not supported by allreduce.MPI")
    raise AttributeError(f"module 'allreduce.MPI' has no attribute {name!r}")


def Init() -> None:
    """Join the default group now rather than on first use of ``COMM_WORLD``."""
    init_world()


def Finalize() -> None:
    """Leave the default group (done at exit anyway)."""
    finalize()


def Is_initialized() -> bool:
    return api.is_initialized()


def Wtime() -> float:
    """Seconds on a monotonic clock: for measuring intervals, like ``MPI_Wtime``."""
    return time.perf_counter()


def Wtick() -> float:
    """The resolution of :func:`Wtime`, in seconds."""
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:
    return socket.gethostname()
