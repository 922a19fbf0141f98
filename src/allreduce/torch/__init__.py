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
from .horovod import elastic
from .horovod.sync_batch_norm import SyncBatchNorm
from . import mpi_ops
from .mpi_ops import *  # noqa: F403 (Horovod's horovod.torch API: the names of mpi_ops.__all__)
from .trainers.broadcast import broadcast_optimizer_state, broadcast_parameters
from .trainers.optimizer import DistributedOptimizer
from .trainers.scaler import DynamicLossScaler
from .trainers.zero import ZeroRedundancyOptimizer

register_backend()

__all__ = [
    "Compression", "Compressor", "DistributedOptimizer", "DynamicLossScaler", "ErrorFeedback",
    "ProcessGroupAllreduce", "Staged", "SyncBatchNorm", "ZeroRedundancyOptimizer", "broadcast_optimizer_state",
    "broadcast_parameters", "elastic", "reduce_flat", "register_backend",
] + mpi_ops.__all__  # Horovod's horovod.torch API
