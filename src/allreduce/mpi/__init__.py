"""mpi4py's ``MPI`` module on allreduce: change ``from mpi4py import MPI`` to ``from allreduce import MPI``.

The same script then runs under ``allreduce run -n 4 -- python script.py``, ``mpirun``/``mpiexec``
(Open MPI, MPICH) and ``srun``, with no MPI installed: ``COMM_WORLD`` joins the library's default
group on first use (see :mod:`.comm`). What MPI offers and this library has no counterpart for,
one-sided communication, MPI-IO, process topologies, dynamic processes, inter-communicators,
distributed-array datatypes, raises ``NotImplementedError`` naming the feature. See
docs/mpi.md.
"""

from __future__ import annotations

from .. import api
from .arrays import array_of as _array_of
from .comm import COMM_NULL, COMM_SELF, COMM_WORLD, UNDEFINED, Comm, Intercomm, finalize, init_world
from .datatypes import *  # noqa: F403 - every datatype name MPI has
from .constants import BOTTOM, BUFFER_AUTOMATIC, IN_PLACE, BottomType, BufferAutomaticType, InPlaceType
from .commctx import commctx_inter as _commctx_inter, commctx_intra as _commctx_intra  # mpi4py.util.pkl5's
from .datatypes import Datatype
from .typecodes import typealign_of as _typealign, typecode_of as _typecode  # mpi4py.util uses both
from .environment import *  # noqa: F403 - versions, thread levels, the environment's constants
from .memory import *  # noqa: F403 - MPI.buffer, Alloc_mem, attached buffers (once environment's)
from .errorcodes import *  # noqa: F403 - the error classes
from .errorcodes import ERR_DIMS, NAMES as _ERROR_NAMES, Exception, error as _error
from .groups import CONGRUENT, GROUP_EMPTY, GROUP_NULL, IDENT, SIMILAR, UNEQUAL, Group
from .handles import addressof as _addressof, handleof as _handleof, sizeof as _sizeof  # mpi4py's object model
from .capi import CAPI as __pyx_capi__  # mpi4py's C API: PyMPI<Class>_New and _Get as PyCapsules
from .info import ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN, INFO_ENV, INFO_NULL, Errhandler, Info
from .locks import comm_lock as _comm_lock, comm_lock_table as _comm_lock_table  # mpi4py.util.pkl5's
from .messages import MESSAGE_NO_PROC, MESSAGE_NULL, Message
from .pickler import Pickle, pickle
from .reductions import (
    BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, NO_OP, OP_NULL, PROD, REPLACE, SUM, Op,
)
from .refused import FILE_NULL, SESSION_NULL, WIN_NULL, File, Session, Win
from .requests import REQUEST_NULL, Grequest, Prequest, Request
from .status import ANY_SOURCE, ANY_TAG, PROC_NULL, Status

Intracomm = Comm
SUCCESS = 0

_UNSUPPORTED = {  # module attributes of MPI features this library does not offer
    "Cartcomm": "process topologies (MPI.Cartcomm)",
    "Graphcomm": "process topologies (MPI.Graphcomm)",
    "Distgraphcomm": "process topologies (MPI.Distgraphcomm)",
    "Topocomm": "process topologies (MPI.Topocomm)",
    "Open_port": "dynamic process management (MPI.Open_port)",
    "Close_port": "dynamic process management (MPI.Close_port)",
    "Lookup_name": "dynamic process management (MPI.Lookup_name)",
    "Publish_name": "dynamic process management (MPI.Publish_name)",
    "Get_hw_resource_info": "MPI-4.1 hardware resource information",
}


def __getattr__(name: str):
    if name == "BFLOAT16_T":  # made on first use (see .datatypes)
        from .datatypes import BFLOAT16_T

        return BFLOAT16_T
    if name in _UNSUPPORTED:
        raise NotImplementedError(f"{_UNSUPPORTED[name]} is not supported by allreduce.MPI")
    raise AttributeError(f"module 'allreduce.MPI' has no attribute {name!r}")


def Init() -> None:
    """Join the default group now rather than on first use of ``COMM_WORLD``."""
    init_world()


def Init_thread(required: int = 3) -> int:
    """:func:`Init`; every thread level is provided (``THREAD_MULTIPLE``)."""
    init_world()
    return 3


def Finalize() -> None:
    """Leave the default group (done at exit anyway)."""
    finalize()


def Is_initialized() -> bool:
    return api.is_initialized()


def Get_address(location) -> int:
    """The address of a buffer's first byte (what MPI's absolute displacements count from)."""
    if location is None:
        return 0
    if isinstance(location, (BottomType, InPlaceType, BufferAutomaticType)):
        return int(location)
    arr = _array_of(location, "location", False)
    return int(arr.__array_interface__["data"][0])


def Compute_dims(nnodes: int, dims) -> list[int]:
    """A grid of ``nnodes`` processes as balanced as it can be (``MPI_Dims_create``): ``dims`` is the
    number of dimensions, or one entry per dimension, ``0`` where the size is free; the free sizes
    come out in non-increasing order.

    Raises:
        MPI.Exception: ``ERR_DIMS`` where the fixed sizes do not divide ``nnodes``.
    """
    dims = [0] * int(dims) if isinstance(dims, int) else [int(d) for d in dims]
    fixed = 1
    for d in dims:
        fixed *= d if d > 0 else 1
    if int(nnodes) < 0 or any(d < 0 for d in dims) or int(nnodes) % fixed:
        raise _error(ERR_DIMS, f"{nnodes} processes do not fill a grid {dims}")
    free = [1] * dims.count(0)
    left, factor = int(nnodes) // fixed, 2
    primes = []
    while left > 1:  # its prime factors, largest first, each to the free dimension now smallest
        while left % factor == 0:
            primes.append(factor)
            left //= factor
        factor += 1
    for prime in reversed(primes):
        if free:
            free[free.index(min(free))] *= prime
    free.sort(reverse=True)
    return [d if d > 0 else free.pop(0) for d in dims]


def Aint_add(base: int, disp: int) -> int:
    return int(base) + int(disp)


def Aint_diff(addr1: int, addr2: int) -> int:
    return int(addr1) - int(addr2)
