"""The optimizer that averages (or sums) gradients across ranks while backward runs, then steps.

It registers a hook on every parameter that fires once backward has accumulated the parameter's
gradient. Each gradient marks its fusion bucket; a bucket whose gradients are all in is *launched* —
handed to the communication thread that packs it, reduces it
(:func:`~allreduce.torch.common.reduction.reduce_flat`, through the compressor) and unpacks it —
while backward goes on computing the earlier layers. ``step()`` waits for every bucket, launching
first those still waiting for gradients that never came (unused parameters: their gradient counts as
zero), then steps the wrapped optimizer.

Buckets are launched strictly in bucket order (a ready bucket waits for the ones before it) and the
communication thread runs them one after the other, so every rank issues the same collectives in the
same order whatever order its hooks fire in. With ``backward_passes_per_step=k`` a parameter's hook
counts passes and the bucket waits for the k-th; gradients accumulate in ``.grad`` meanwhile.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from ...ops import ReduceOp

from ..common.reduction import reduce_flat
from ..horovod import joining
from . import buckets as _buckets
from .wrapped import WrappedOptimizer, evaluate


class AveragingOptimizer(WrappedOptimizer):
    """``DistributedOptimizer`` with ``op`` SUM or AVG; see the module docstring.

    Raises:
        ValueError: ``gradient_predivide_factor`` with an op other than AVG.
    """

    def __init__(self, optimizer, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, process_set, fusion_threshold_mb, group):
        if gradient_predivide_factor != 1.0 and op != ReduceOp.AVG:
            raise ValueError(f"gradient_predivide_factor needs op=Average (as in Horovod), got op={op!r}")
        self._synchronized = False
        self._skip = False
        self._hooks: list = []
        super().__init__(optimizer, named_parameters, compression, backward_passes_per_step, ReduceOp(op),
                         gradient_predivide_factor, groups, process_set, fusion_threshold_mb, group)

    def synchronize(self) -> None:
        """Wait until every gradient is reduced (launching buckets still waiting); idempotent until
        the next backward pass."""
        with self._lock:
            if self._synchronized:
                return
            while self._next < len(self._buckets):
                self._launch()
            in_flight, self._in_flight = self._in_flight, []
        try:
            for future in in_flight:
                future.result()
        finally:
            with self._lock:
                self._reset()
                self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, ``step()`` does not synchronize: call ``synchronize()`` yourself first, e.g. to clip.

        Example::

            loss.backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with opt.skip_synchronize():
                opt.step()
        """
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def step(self, closure=None):
        """Synchronize (unless inside ``skip_synchronize``), then step the wrapped optimizer.

        A ``closure`` is evaluated once, before synchronizing (optimizers that re-evaluate it, such as
        LBFGS, are not supported). Returns the closure's loss.

        Warns (as Horovod): outside ``skip_synchronize`` after an explicit ``synchronize()``.

        Raises:
            RuntimeError: inside ``skip_synchronize`` while reductions are still in flight.
        """
        loss = evaluate(closure)
        if not self._skip:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): step() synchronizes again; wrap it in "
                              "`with optimizer.skip_synchronize():`", stacklevel=2)
            self.synchronize()
        elif self.in_flight:
            raise RuntimeError("step() inside skip_synchronize() while gradient reductions are in flight; "
                               "call synchronize() before entering skip_synchronize()")
        self.optimizer.step()
        self._synchronized = False
        return loss

    def close(self) -> None:
        """Remove the hooks, then close as every distributed optimizer does."""
        for hook in self._hooks:
            hook.remove()
        super().close()

    # ---- hooks and launching ---------------------------------------------------------------------

    def _arrange(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Build the buckets of ``named`` and hook every parameter (none without peers)."""
        for hook in self._hooks:
            hook.remove()
        super()._arrange(named)
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._name_of = {p: name for name, p in named}
        hooked = named if self._group is not None else []
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for _, p in hooked]

    def _reset(self) -> None:
        """Forget the passes counted since the last synchronization (with the lock held, or alone)."""
        self._passes: dict[torch.Tensor, int] = {}
        self._waiting = [len(b.params) for b in self._buckets]  # gradients each bucket still waits for
        # with nobody to reduce with, every bucket counts as launched: synchronize() has nothing to do
        self._next = 0 if self._group is not None else len(self._buckets)

    def _on_gradient(self, p: torch.Tensor) -> None:
        with self._lock:
            passes = self._passes.get(p, 0) + 1
            if passes > self.backward_passes_per_step:
                raise RuntimeError(
                    f"the gradient of {self._name_of[p]} was computed {passes} times before step(); raise "
                    f"backward_passes_per_step (now {self.backward_passes_per_step}) to accumulate locally")
            self._passes[p] = passes
            self._synchronized = False
            if passes < self.backward_passes_per_step:
                return
            self._waiting[self._bucket_of[p].index] -= 1
            while self._next < len(self._buckets) and self._waiting[self._next] == 0:
                self._launch()

    def _launch(self) -> None:
        """Hand bucket ``self._next`` to the communication thread (with the lock held)."""
        bucket = self._buckets[self._next]
        self._next += 1
        self._in_flight.append(self._comm.submit(self._reduce, bucket))

    def _reduce(self, bucket: _buckets.Bucket) -> None:
        bucket.pack()
        flat, factor = bucket.buffer, self.gradient_predivide_factor
        self._agree(joining.REDUCE, self.op, flat)
        if factor != 1.0:
            flat.div_(factor)
        reduce_flat(flat, self.compression, self.op, self._group)
        if factor != 1.0:
            flat.mul_(factor)
        bucket.unpack()
