"""Horovod's ``horovod.torch`` API, also under the module name Horovod scripts import parts of it from
(``from horovod.torch.mpi_ops import synchronize``); :mod:`allreduce.torch` re-exports all of it."""

from .horovod.basics import (
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, ccl_built, cross_rank, cross_size, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size, start_timeline, stop_timeline,
)
from .horovod.broadcasts import (
    barrier, broadcast, broadcast_, broadcast_async, broadcast_async_, broadcast_object, join,
)
from .horovod.gathers import (
    allgather, allgather_async, allgather_object, alltoall, alltoall_async, grouped_allgather,
    grouped_allgather_async, sparse_allreduce_async,
)
from .horovod.handles import poll, synchronize
from .horovod.process_sets import (
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
from .horovod.reducescatters import (
    grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async,
)
from .horovod.reductions import (
    allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_,
)

__all__ = [
    "Adasum", "Average", "HorovodInternalError", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set",
    "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "init", "is_initialized", "join", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size", "sparse_allreduce_async",
    "start_timeline", "stop_timeline", "synchronize",
]
