"""Deep-learning integration: torch tensors, data-parallel optimizers and a torch.distributed backend.

- :func:`DistributedOptimizer` wraps any torch optimizer and averages gradients across ranks during
  backward (fused into buckets, optionally compressed to fp16/bf16 on the wire with float32 sums);
  :func:`broadcast_parameters` and :func:`broadcast_optimizer_state` start every rank alike;
  :class:`DynamicLossScaler` keeps fp16 gradients in range.
- :class:`ZeroRedundancyOptimizer` shards optimizer state (stage 1) and gradients (stage 2).
- Importing this package registers the torch.distributed backend ``"allreduce"``, so
  ``torch.distributed.init_process_group("allreduce")`` and DistributedDataParallel run on it.
- It is also Horovod's ``horovod.torch`` API: ``import allreduce.torch as hvd`` ports a Horovod script
  (``hvd.init()``, ``hvd.allreduce``, ``hvd.DistributedOptimizer(..., op=hvd.Adasum)``, process sets,
  ``hvd.join()``...); docs/horovod.md says what differs.

This package needs torch (``pip install allreduce[torch]``); ``import allreduce`` does not.

Example (every rank, under ``allreduce run -n 4 -- python train.py``)::

    import allreduce, allreduce.torch as art
    allreduce.init_process_group()
    opt = art.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    art.broadcast_parameters(model.state_dict(), root_rank=0)
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:
    raise ImportError("allreduce.torch needs PyTorch: pip install 'allreduce[torch]'") from exc

from .c10d.backend import ProcessGroupAllreduce
from .c10d.plugin import register_backend
from .common.compression import Compression, Compressor, ErrorFeedback
from .common.reduction import reduce_flat
from .common.tensors import Staged
from .horovod.basics import (
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, ccl_built, cross_rank, cross_size, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
)
from .horovod.broadcasts import (
    barrier, broadcast, broadcast_, broadcast_async, broadcast_async_, broadcast_object, join,
)
from .horovod.gathers import (
    allgather, allgather_async, allgather_object, alltoall, alltoall_async, grouped_allgather,
    grouped_allgather_async, sparse_allreduce_async,
)
from .horovod.handles import poll, synchronize
from .horovod.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .horovod.reducescatters import (
    grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async,
)
from .horovod.reductions import (
    allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_,
)
from .trainers.broadcast import broadcast_optimizer_state, broadcast_parameters
from .trainers.optimizer import DistributedOptimizer
from .trainers.scaler import DynamicLossScaler
from .trainers.zero import ZeroRedundancyOptimizer

register_backend()

__all__ = [
    "Compression", "Compressor", "DistributedOptimizer", "DynamicLossScaler", "ErrorFeedback",
    "ProcessGroupAllreduce", "Staged", "ZeroRedundancyOptimizer", "broadcast_optimizer_state",
    "broadcast_parameters", "reduce_flat", "register_backend",
    # Horovod's horovod.torch API
    "Adasum", "Average", "HorovodInternalError", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set",
    "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "init", "is_initialized", "join", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank",
    "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size",
    "sparse_allreduce_async", "synchronize",
]
