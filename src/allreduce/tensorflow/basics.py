"""Horovod's process-level API for TensorFlow: ``init``/``shutdown`` and where this rank sits.

``hvd.init()`` joins allreduce's default group (``env://``: under ``allreduce run``, ``torchrun``,
``mpirun``, ``srun``), or adopts it when the script formed it already; a process started without a
launcher is a job of one rank, as in Horovod. ``local_*``/``cross_*`` come from the group's topology.
The ``*_built()`` queries say ``False``: this library is built on none of MPI, Gloo or NCCL.
"""

from __future__ import annotations

import atexit

from .. import api, rendezvous
from ..errors import AllreduceError
from ..ops import ReduceOp

Average, Sum, Min, Max, Product = ReduceOp.AVG, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT
HorovodInternalError = AllreduceError  # what Horovod raises when a collective fails


class _State:
    world = None  # the group of every rank, from init() to shutdown()
    formed = False  # whether init() formed it (then shutdown() destroys it)


def init(comm=None, process_sets=None) -> None:
    """Join the job, or adopt allreduce's default group; again while initialized, nothing.

    Example (every rank, under ``allreduce run -n 2 -- python train.py``)::

        hvd.init()
        hvd.rank(), hvd.size()           # (0, 2) or (1, 2)

    Raises:
        NotImplementedError: ``comm`` or ``process_sets`` was given. RendezvousError: no other ranks.
    """
    if comm is not None or process_sets not in (None, "dynamic"):
        raise NotImplementedError("allreduce.tensorflow runs on the global process set only: hvd.init() takes "
                                  "no comm or process_sets")
    if is_initialized():
        return
    _State.formed = not api.is_initialized()
    if _State.formed and rendezvous.from_environment().source == "none":  # started alone: one rank
        api.init_process_group(store=rendezvous.HashStore(), rank=0, world_size=1)
    elif _State.formed:
        api.init_process_group()
    _State.world = api.default_group()
    atexit.unregister(shutdown)
    atexit.register(shutdown)


def shutdown() -> None:
    """Leave the job if :func:`init` joined it."""
    if _State.formed and api.is_initialized():
        api.destroy_process_group()
    _State.world, _State.formed = None, False


def is_initialized() -> bool:
    """Whether :func:`init` was called (and :func:`shutdown` not since)."""
    return _State.world is not None


class _GlobalProcessSet:
    """Horovod's ``hvd.global_process_set``: every rank (the only process set here)."""

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def world(process_set=None):
    """The group of every rank (``process_set``: ``None`` or :data:`global_process_set`).

    Raises:
        ValueError: :func:`init` has not been called. NotImplementedError: another process set.
    """
    if process_set not in (None, global_process_set):
        raise NotImplementedError(f"allreduce.tensorflow runs on the global process set only, got {process_set!r}")
    if _State.world is None:
        raise ValueError("Horovod has not been initialized; use hvd.init()")
    return _State.world


def rank() -> int:
    """This process's rank in the job. Raises ``ValueError`` before :func:`init` (as all of these do)."""
    return world().rank


def size() -> int:
    """The number of ranks in the job."""
    return world().size


def local_rank() -> int:
    """This rank's index among the ranks on its host."""
    return world().topology.local_rank


def local_size() -> int:
    """The number of ranks on this rank's host."""
    return world().topology.local_size


def cross_rank() -> int:
    """The index of this rank's host among the hosts that have a rank with this ``local_rank``."""
    return world().topology.cross_rank


def cross_size() -> int:
    """The number of hosts that have a rank with this ``local_rank``."""
    return world().topology.cross_size


def _absent(feature: str):
    def query() -> bool:
        return False

    query.__doc__ = f"False: allreduce is not built on {feature}."
    return query


mpi_built = mpi_enabled = mpi_threads_supported = _absent("MPI")
gloo_built = gloo_enabled = _absent("Gloo")
nccl_built = _absent("NCCL")
cuda_built = _absent("CUDA kernels")
rocm_built = _absent("ROCm kernels")
