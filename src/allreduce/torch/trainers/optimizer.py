"""``DistributedOptimizer``: data-parallel training, Horovod's keywords choosing the optimizer.

As Horovod's factory does, it returns the optimizer ``op`` asks for: one that reduces gradients during
backward (:mod:`.averaging`), or, with ``op=Adasum``, one that combines each parameter's step
(:mod:`.adasum`). Both are a ``torch.optim.Optimizer`` that is the optimizer they wrap (:mod:`.wrapped`).
"""

from __future__ import annotations

import warnings

import torch

from ...ops import ReduceOp

from ..common.compression import Compression, Compressor
from ..common.reduction import REDUCTIONS
from ..horovod.adasum import ADASUM
from ..horovod.reductions import resolve_op
from .adasum import AdasumOptimizer
from .averaging import AveragingOptimizer
from .wrapped import DEFAULT_FUSION_MB, WrappedOptimizer


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression: Compressor = Compression.none, backward_passes_per_step: int = 1,
                         op=ReduceOp.AVG, gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                         sparse_as_dense: bool = False, process_set=None, *,
                         fusion_threshold_mb: float = DEFAULT_FUSION_MB, group=None) -> WrappedOptimizer:
    """Wrap ``optimizer`` to average gradients across ranks during backward, then step it; with
    ``op=Adasum``, Horovod's delta optimizer instead (:class:`~.adasum.AdasumOptimizer`).

    The arguments up to ``process_set`` are Horovod's, in Horovod's order and meaning.

    Args:
        optimizer: any ``torch.optim.Optimizer``; it is wrapped, not changed.
        named_parameters: ``model.named_parameters()``, for names in error messages; every parameter of
            ``optimizer`` must be among them. Default: names ``param.<i>``.
        compression: how gradients travel (``Compression.none``, ``fp16``, ``bf16``, ``error_feedback``).
        backward_passes_per_step: backward passes whose gradients accumulate locally per reduction.
        op: ``ReduceOp.AVG`` (``hvd.Average``, default), ``ReduceOp.SUM`` or ``hvd.Adasum``.
        gradient_predivide_factor: with AVG, divide gradients by this before the sum and multiply by
            it after (the average is unchanged; it shifts where rounding happens).
        num_groups: Horovod's deprecated spelling of ``groups=<int>``.
        groups: ``k`` (the parameters cut into ``k`` consecutive fusion groups) or a list of lists of
            parameters (each list one group, every other parameter a group of its own); each group is
            reduced as one message, replacing ``fusion_threshold_mb``.
        sparse_as_dense: accepted for Horovod; sparse gradients are always reduced dense and handed
            back sparse.
        process_set: reduce over this ``hvd`` process set; on ranks outside it nothing is reduced.
        fusion_threshold_mb: bucket size in MiB; 0 reduces each gradient on its own.
        group: an allreduce group, a torch group on the ``"allreduce"`` backend, or ``None`` (default).

    Example (every rank)::

        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=Compression.fp16)
        broadcast_parameters(model.state_dict(), root_rank=0)
        loss_fn(model(x), y).backward()    # reductions start here, bucket by bucket
        opt.step()                         # waits for them; every rank applies the same average

    Raises:
        ValueError: bad options, or ``named_parameters`` that do not cover the optimizer's parameters.
    """
    try:
        resolved = resolve_op(op)  # Horovod's ops, or torch's by name (never by number)
    except ValueError:
        resolved = None
    if resolved is not ADASUM and resolved not in REDUCTIONS:
        raise ValueError(f"op must be ReduceOp.AVG (hvd.Average), ReduceOp.SUM (hvd.Sum) or hvd.Adasum, got {op!r}")
    op = resolved
    if num_groups:
        warnings.warn("num_groups is deprecated (as in Horovod); pass groups=", DeprecationWarning, stacklevel=2)
        groups = num_groups if groups is None else groups
    chosen = AdasumOptimizer if op is ADASUM else AveragingOptimizer
    return chosen(optimizer, named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                  groups, process_set, fusion_threshold_mb, group)
