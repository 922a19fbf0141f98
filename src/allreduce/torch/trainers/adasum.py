"""Horovod's Adasum optimizer: step locally, then combine each parameter's change across ranks.

Nothing is reduced during backward: ``step()`` steps the wrapped optimizer on the local gradients,
and the change it made to each parameter is combined across ranks by Adasum
(:mod:`allreduce.torch.horovod.adasum`, each parameter its own segment, each bucket one message)
and applied to the old values.
"""

from __future__ import annotations

import torch

from ...ops import ReduceOp

from ..horovod import joining
from ..horovod.adasum import reduce as adasum_reduce
from . import buckets as _buckets
from .wrapped import WrappedOptimizer, evaluate


class AdasumOptimizer(WrappedOptimizer):
    """``DistributedOptimizer`` with ``op=Adasum``; see the module docstring.

    Raises:
        ValueError: a ``gradient_predivide_factor`` (it needs op=Average, as in Horovod).
    """

    def __init__(self, optimizer, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, process_set, fusion_threshold_mb, group):
        if gradient_predivide_factor != 1.0:
            raise ValueError(f"gradient_predivide_factor needs op=Average (as in Horovod), got op={op!r}")
        super().__init__(optimizer, named_parameters, compression, backward_passes_per_step, op,
                         gradient_predivide_factor, groups, process_set, fusion_threshold_mb, group)

    def synchronize(self) -> None:
        """Nothing to wait for: ``step()`` reduces."""

    def skip_synchronize(self):
        """Refused, as in Horovod: ``step()`` is where Adasum reduces.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("skip_synchronize() is not supported with op=Adasum: its step() reduces")

    def step(self, closure=None):
        """Step the wrapped optimizer, then replace each parameter by its old value plus the Adasum of
        every rank's change (without peers: the local step). Returns the closure's loss."""
        loss = evaluate(closure)
        if self._group is None:
            self.optimizer.step()
            return loss
        before = {p: p.detach().clone() for b in self._buckets for p in b.params}
        self.optimizer.step()
        for future in [self._comm.submit(self._combine, b, before) for b in self._buckets]:
            future.result()
        return loss

    def _combine(self, bucket: _buckets.Bucket, before: dict) -> None:
        for p, part in zip(bucket.params, bucket.views()):
            part.copy_((p.detach() - before[p]).reshape(-1))
        self._agree(joining.ADASUM, ReduceOp.SUM, bucket.buffer)
        adasum_reduce(bucket.buffer, bucket.sizes, self.compression, self._group)
        with torch.no_grad():  # (grad mode is per thread)
            for p, part in zip(bucket.params, bucket.views()):
                p.copy_(before[p] + part.view(p.shape).to(p.device))
