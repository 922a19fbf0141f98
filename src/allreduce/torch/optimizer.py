"""``DistributedOptimizer``: data-parallel training by averaging gradients across ranks.

It wraps the user's optimizer (composition: the optimizer object is kept as it is) and registers a
hook on every parameter that fires once backward has accumulated the parameter's gradient. Each
gradient marks its fusion bucket (:mod:`.buckets`); a bucket whose gradients are all in is *launched*
— handed to one communication thread that packs it, reduces it (:func:`.reduction.reduce_flat`,
through the compressor) and unpacks it — while backward goes on computing the earlier layers.
``step()`` waits for every bucket, launching first those still waiting for gradients that never came
(unused parameters: their gradient counts as zero), then steps the wrapped optimizer.

Buckets are launched strictly in bucket order (a ready bucket waits for the ones before it) and the
communication thread runs them one after the other, so every rank issues the same collectives in the
same order whatever order its hooks fire in. With ``backward_passes_per_step=k`` a parameter's hook
counts passes and the bucket waits for the k-th; gradients accumulate in ``.grad`` meanwhile.
Between backward and ``step()`` the group carries the gradients: a collective issued on the same group
from elsewhere in that window could interleave differently on different ranks (give it its own group).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading

import torch

from allreduce.ops import ReduceOp

from . import buckets as _buckets
from .compression import Compression, Compressor
from .groups import resolve
from .reduction import REDUCTIONS, reduce_flat

DEFAULT_FUSION_MB = 25.0  # bucket size; gradients of a model smaller than this travel as one message


class DistributedOptimizer:
    """Average gradients across ranks during backward, then step ``optimizer``.

    Args:
        optimizer: any ``torch.optim.Optimizer``; it is wrapped, not changed.
        named_parameters: ``model.named_parameters()``, for names in error messages; every parameter of
            ``optimizer`` must be among them. Default: names ``param.<i>``.
        compression: how gradients travel (``Compression.none``, ``fp16``, ``bf16``, ``error_feedback``).
        op: ``ReduceOp.AVG`` (default) or ``ReduceOp.SUM``.
        backward_passes_per_step: backward passes whose gradients accumulate locally per reduction.
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

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None, compression: Compressor = Compression.none,
                 op: ReduceOp = ReduceOp.AVG, backward_passes_per_step: int = 1,
                 fusion_threshold_mb: float = DEFAULT_FUSION_MB, group=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(compression, Compressor):
            raise TypeError(f"compression must be a Compressor such as Compression.fp16, got {compression!r}")
        if op not in REDUCTIONS:
            raise ValueError(f"op must be ReduceOp.AVG or ReduceOp.SUM, got {op!r}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
        if not fusion_threshold_mb >= 0:
            raise ValueError(f"fusion_threshold_mb must be >= 0, got {fusion_threshold_mb!r}")
        self.optimizer = optimizer
        self.compression = compression
        self.op = ReduceOp(op)
        self.backward_passes_per_step = backward_passes_per_step
        self._group = resolve(group)
        named = _named(optimizer, named_parameters)
        self._buckets = _buckets.assign(named, int(fusion_threshold_mb * 2**20))
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._name_of = {p: name for name, p in named}
        self._lock = threading.Lock()
        self._passes: dict[torch.Tensor, int] = {}
        self._waiting = [len(b.params) for b in self._buckets]  # gradients each bucket still waits for
        self._next = 0  # index of the next bucket to launch
        self._in_flight: list[concurrent.futures.Future] = []
        self._synchronized = False
        self._skip = False
        self._comm = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="allreduce-grads")
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for _, p in named]

    # ---- the wrapped optimizer -------------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    # ---- training --------------------------------------------------------------------------------

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    @property
    def in_flight(self) -> int:
        """Buckets handed to communication and not yet waited for by ``synchronize``."""
        with self._lock:
            return len(self._in_flight)

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
                self._passes.clear()
                self._waiting = [len(b.params) for b in self._buckets]
                self._next = 0
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

        Raises:
            RuntimeError: inside ``skip_synchronize`` while reductions are still in flight.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._skip:
            self.synchronize()
        elif self.in_flight:
            raise RuntimeError("step() inside skip_synchronize() while gradient reductions are in flight; "
                               "call synchronize() before entering skip_synchronize()")
        self.optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; refused while reductions are in flight (they would write into them).

        Raises:
            RuntimeError: reductions launched by backward have not been waited for by ``step()``/``synchronize()``.
        """
        if self.in_flight:
            raise RuntimeError("zero_grad() called while gradient reductions are in flight; call step() or "
                               "synchronize() first (or zero_grad() before backward)")
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def close(self) -> None:
        """Remove the hooks and stop the communication thread once the reductions in flight are done.

        Buckets still waiting for gradients are not launched: every rank may close at any time.
        Raises the error of a reduction that failed in flight.
        """
        for hook in self._hooks:
            hook.remove()
        self._comm.shutdown(wait=True)
        with self._lock:
            in_flight, self._in_flight = self._in_flight, []
        for future in in_flight:
            future.result()

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, compression={self.compression!r}, "
                f"op={self.op.name}, buckets={len(self._buckets)})")

    # ---- hooks and launching ---------------------------------------------------------------------

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
        reduce_flat(bucket.buffer, self.compression, self.op, self._group)
        bucket.unpack()


def _named(optimizer: torch.optim.Optimizer, named_parameters) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's trainable parameters in order, each with its name."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if len(set(params)) != len(params):
        raise ValueError("a parameter appears twice in the optimizer's param_groups")
    if named_parameters is None:
        return [(f"param.{i}", p) for i, p in enumerate(params)]
    names: dict[torch.Tensor, str] = {}
    for name, p in named_parameters:
        if not isinstance(name, str) or not isinstance(p, torch.Tensor):
            raise ValueError(f"named_parameters must yield (str, tensor) pairs, got ({name!r}, {type(p).__name__})")
        names.setdefault(p, name)
    if len(set(names.values())) != len(names):
        raise ValueError("named_parameters has duplicate names")
    missing = [i for i, p in enumerate(params) if p not in names]
    if missing:
        raise ValueError(f"named_parameters does not name the optimizer's parameters at positions {missing}; "
                         f"pass model.named_parameters() of the model the optimizer trains")
    return [(names[p], p) for p in params]
