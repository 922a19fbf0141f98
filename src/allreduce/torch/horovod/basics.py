"""Horovod's process-level API: ``init``/``shutdown``, where this rank sits, what was built, the ops.

``hvd.init()`` joins allreduce's default group (``allreduce.init_process_group()``: ``env://``, so it
runs under ``allreduce run``, ``torchrun``, ``mpirun`` and ``srun``), or adopts it when the script
formed it already; a process started without a launcher is a job of one rank, as in Horovod.
``local_*``/``cross_*`` come from the group's topology, in Horovod's vocabulary.

The ``*_built()``/``*_enabled()`` queries answer truthfully for this library: it is built on none of
MPI, Gloo, NCCL, DDL, oneCCL, CUDA or ROCm kernels (CUDA tensors are staged through host memory), so
every one says ``False``. Scripts that pick a code path by them (e.g. scaling the learning rate by
``local_size()`` for GPU Adasum when ``nccl_built()``) take the CPU path, which is the one that
matches what runs here.
"""

from __future__ import annotations

import atexit

from ... import api, rendezvous
from ...errors import AllreduceError
from ...ops import ReduceOp

from . import handles, joining, negotiation, timeline
from . import process_sets as registry
from .adasum import ADASUM

Average, Sum, Min, Max, Product = ReduceOp.AVG, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT
Adasum = ADASUM
HorovodInternalError = AllreduceError  # what Horovod raises when a collective fails


class _State:
    formed = False  # whether init() formed the default group (then shutdown() destroys it)


def init(comm=None, process_sets=None) -> None:
    """Join the job (or adopt allreduce's default group) and register ``process_sets``.

    Calling it again while initialized does nothing, as in Horovod; :func:`shutdown` runs at exit.

    Args:
        comm: must be ``None``: an mpi4py communicator or a list of ranks to run on is not supported.
        process_sets: :class:`ProcessSet` objects to register, in the same order on every rank
            (``"dynamic"`` is accepted: sets can always be added later).

    Example (every rank, under ``allreduce run -n 4 -- python train.py``)::

        hvd.init()
        hvd.rank(), hvd.size()           # e.g. (2, 4)

    Raises:
        NotImplementedError: ``comm`` was given. RendezvousError: the other ranks were not found.
    """
    if comm is not None:
        raise NotImplementedError("hvd.init(comm=...) is not supported: start one process per rank, e.g. under "
                                  "`allreduce run -n N`, and use process sets for subsets")
    if is_initialized():
        return
    _State.formed = not api.is_initialized()
    if _State.formed and api.is_replacement():  # started to take a dead worker's place: wait to be let in
        api.join_group()
    elif _State.formed and rendezvous.from_environment().source == "none":  # started alone: one rank, as Horovod
        api.init_process_group(store=rendezvous.HashStore(), rank=0, world_size=1)
    elif _State.formed:
        api.init_process_group()
    adopt(api.default_group())
    atexit.unregister(shutdown)  # registered once, however often init() and shutdown() alternate
    atexit.register(shutdown)
    for process_set in [] if process_sets in (None, "dynamic") else process_sets:
        registry.add_process_set(process_set)


def shutdown() -> None:
    """Forget handles and process sets, and leave the job if :func:`init` joined it."""
    if not is_initialized():
        return
    timeline.close_timeline()
    forget()
    if _State.formed and api.is_initialized():
        api.destroy_process_group()
    _State.formed = False


def adopt(world) -> None:
    """Make ``world`` the global process set's group and serve joins on it (``init``, and elastic mode's
    reset on the group that the survivors form)."""
    registry.setup(world)
    joining.enable(world)


def forget() -> None:
    """Drop the handles, negotiations, joins and process sets of the current group (``shutdown``, and
    elastic mode's reset before the survivors form a new one)."""
    handles.clear()
    negotiation.clear()
    joining.disable()
    registry.teardown()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing Horovod's timeline (:mod:`.timeline`) to ``file_path``; rank 0 writes, the other
    ranks' calls do nothing. A timeline already open is closed first.

    Example (every rank)::

        hvd.start_timeline("timeline.json")
        hvd.allreduce(x, name="x")          # "allreduce.x": NEGOTIATE_ALLREDUCE, then ALLREDUCE
        hvd.stop_timeline()

    Raises:
        ValueError: ``hvd.init()`` has not been called. OSError: the file cannot be written.
    """
    if rank() == 0:
        timeline.open_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Close the timeline (nothing to do if none is open)."""
    timeline.close_timeline()


def is_initialized() -> bool:
    return registry.global_process_set.group is not None


def rank() -> int:
    """This process's rank in the job. Raises ``ValueError`` before :func:`init` (as all of these do)."""
    return registry.world().rank


def size() -> int:
    return registry.world().size


def local_rank() -> int:
    """This rank's index among the ranks on its host."""
    return registry.world().topology.local_rank


def local_size() -> int:
    return registry.world().topology.local_size


def cross_rank() -> int:
    """The index of this rank's host among the hosts that have a rank with this ``local_rank``."""
    return registry.world().topology.cross_rank


def cross_size() -> int:
    return registry.world().topology.cross_size


def _absent(feature: str):
    """A build query whose truthful answer is ``False``: allreduce does not run on ``feature``."""
    def query() -> bool:
        return False

    query.__doc__ = f"False: allreduce is not built on {feature} (its transports are its own: shared memory, TCP)."
    return query


mpi_built = _absent("MPI")
mpi_enabled = _absent("MPI")
mpi_threads_supported = _absent("MPI")
gloo_built = _absent("Gloo")
gloo_enabled = _absent("Gloo")
nccl_built = _absent("NCCL")
ddl_built = _absent("IBM DDL")
ccl_built = _absent("oneCCL")
cuda_built = _absent("CUDA kernels")
rocm_built = _absent("ROCm kernels")
