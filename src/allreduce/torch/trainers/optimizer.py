"""``DistributedOptimizer``: data-parallel training by averaging gradients across ranks.

It wraps the user's optimizer (composition: the optimizer object is kept as it is) and is itself a
``torch.optim.Optimizer`` whose ``param_groups``, ``state`` and ``defaults`` *are* the wrapped one's,
so LR schedulers, ``GradScaler`` and ``isinstance`` checks accept it. It registers a hook on every
parameter that fires once backward has accumulated the parameter's gradient. Each gradient marks its
fusion bucket (:mod:`.buckets`); a bucket whose gradients are all in is *launched* — handed to one
communication thread that packs it, reduces it (:func:`.reduction.reduce_flat`, through the
compressor) and unpacks it — while backward goes on computing the earlier layers. ``step()`` waits
for every bucket, launching first those still waiting for gradients that never came (unused
parameters: their gradient counts as zero), then steps the wrapped optimizer.

Buckets are launched strictly in bucket order (a ready bucket waits for the ones before it) and the
communication thread runs them one after the other, on a twin of the caller's group that it formed
(:mod:`.twins`: a group serves one thread at a time), so every rank issues the same collectives in the same
order whatever order its hooks fire in, and collectives the caller issues meanwhile cannot
interleave with them. With ``backward_passes_per_step=k`` a parameter's hook counts passes and the
bucket waits for the k-th; gradients accumulate in ``.grad`` meanwhile.

With ``op=Adasum`` (Horovod's delta optimizer) nothing is reduced during backward: ``step()`` steps
the wrapped optimizer on the local gradients, and the change it made to each parameter is combined
across ranks by Adasum (:mod:`.adasum`, each parameter its own segment) and applied to the old values.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import warnings

import torch

from allreduce import api
from allreduce.ops import ReduceOp

from ..c10d.groups import resolve
from ..common.compression import Compression, Compressor
from ..common.reduction import REDUCTIONS, reduce_flat
from ..horovod import joining, process_sets
from ..horovod.adasum import ADASUM
from ..horovod.adasum import reduce as adasum_reduce
from . import buckets as _buckets
from .twins import twin

DEFAULT_FUSION_MB = 25.0  # bucket size; gradients of a model smaller than this travel as one message


class DistributedOptimizer(torch.optim.Optimizer):
    """Average gradients across ranks during backward, then step ``optimizer``.

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

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None,
                 compression: Compressor = Compression.none, backward_passes_per_step: int = 1, op=ReduceOp.AVG,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                 sparse_as_dense: bool = False, process_set=None, *,
                 fusion_threshold_mb: float = DEFAULT_FUSION_MB, group=None):
        _check_options(optimizer, compression, backward_passes_per_step, op, gradient_predivide_factor,
                       fusion_threshold_mb)
        if num_groups:
            warnings.warn("num_groups is deprecated (as in Horovod); pass groups=", DeprecationWarning, stacklevel=2)
            groups = num_groups if groups is None else groups
        self.optimizer = optimizer
        super().__setstate__({})  # a torch Optimizer's hook tables; its __init__ would replace param_groups
        self.compression = compression
        self.op = op if op is ADASUM else ReduceOp(op)
        self.backward_passes_per_step = backward_passes_per_step
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self._groups = groups
        self._threshold = int(fusion_threshold_mb * 2**20)
        named = _named(optimizer, named_parameters)
        parent = _parent_group(process_set, group)
        self._lock = threading.Lock()
        self._comm = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="allreduce-grads")
        self._group = self._comm.submit(twin, parent, "grads").result() if parent is not None else None
        self._channel = joining.open_channel(self._group, self._comm.submit) if self._group is not None else None
        self._in_flight: list[concurrent.futures.Future] = []
        self._synchronized = False
        self._skip = False
        self._hooks: list = []
        self._arrange(named)

    # ---- the wrapped optimizer -------------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        """Add a parameter group to the wrapped optimizer; its parameters are reduced from now on
        (named ``param_groups.<g>.<i>``). Every rank must add the same groups.

        Raises:
            RuntimeError: reductions are in flight.
        """
        if self.in_flight:
            raise RuntimeError("add_param_group() while gradient reductions are in flight; call step() first")
        self.optimizer.add_param_group(param_group)
        index = len(self.param_groups) - 1
        added = [(f"param_groups.{index}.{i}", p) for i, p in enumerate(self.param_groups[-1]["params"])]
        self._arrange(_named(self.optimizer, self._named + added))

    # ---- training --------------------------------------------------------------------------------

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    @property
    def in_flight(self) -> int:
        """Buckets handed to communication and not yet waited for by ``synchronize``."""
        with self._lock:
            return len(self._in_flight)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change ``backward_passes_per_step`` (Horovod's method); takes effect from the next pass.

        Raises:
            RuntimeError: reductions are in flight.
        """
        if self.in_flight:
            raise RuntimeError("set_backward_passes_per_step() while gradient reductions are in flight")
        _check_options(self.optimizer, self.compression, passes, self.op, self.gradient_predivide_factor, 0)
        self.backward_passes_per_step = passes
        self._reset()

    def synchronize(self) -> None:
        """Wait until every gradient is reduced (launching buckets still waiting); idempotent until
        the next backward pass. With Adasum there is nothing to wait for (``step()`` reduces)."""
        with self._lock:
            if self._synchronized or self.op is ADASUM:
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

        Raises:
            RuntimeError: with ``op=Adasum``, whose ``step()`` does the reduction (as in Horovod).
        """
        if self.op is ADASUM:
            raise RuntimeError("skip_synchronize() is not supported with op=Adasum: its step() reduces")
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
        if self.op is ADASUM and self._group is not None:
            self._adasum_step()
            return loss
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
        """Remove the hooks, close the gradient group and stop the communication thread once the
        reductions in flight are done.

        Buckets still waiting for gradients are not launched: every rank may close at any time.
        Raises the error of a reduction that failed in flight.
        """
        for hook in self._hooks:
            hook.remove()
        joining.close_channel(self._channel)
        with self._lock:
            in_flight, self._in_flight = self._in_flight, []
        try:
            for future in in_flight:
                future.result()
        finally:
            if self._group is not None:
                self._comm.submit(self._group.close).result()
            self._comm.shutdown(wait=True)

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, compression={self.compression!r}, "
                f"op={getattr(self.op, 'name', self.op)}, buckets={len(self._buckets)})")

    # ---- buckets, hooks and launching ------------------------------------------------------------

    def _arrange(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Build the buckets of ``named`` and hook every parameter (none without peers or with Adasum)."""
        for hook in self._hooks:
            hook.remove()
        self._named = named
        groups = _buckets.explicit_groups([p for _, p in named], self._groups)
        self._buckets = (_buckets.assign(named, self._threshold) if groups is None
                         else _buckets.assign_groups(named, groups))
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._name_of = {p: name for name, p in named}
        reduces_in_backward = self._group is not None and self.op is not ADASUM
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for _, p in named if reduces_in_backward]
        self._reset()

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
        joining.agree(self._channel, self._request(joining.REDUCE, flat))
        if factor != 1.0:
            flat.div_(factor)
        reduce_flat(flat, self.compression, self.op, self._group)
        if factor != 1.0:
            flat.mul_(factor)
        bucket.unpack()

    def _request(self, kind: int, flat: torch.Tensor) -> joining.Request:
        op = ReduceOp.SUM if self.op is ADASUM else self.op
        return joining.Request(kind, flat.numel(), flat.dtype, op, self.compression.wire_dtype_for(flat.dtype))

    # ---- Adasum ----------------------------------------------------------------------------------

    def _adasum_step(self) -> None:
        """Step locally, then replace each parameter by its old value plus the Adasum of every rank's change."""
        before = {p: p.detach().clone() for b in self._buckets for p in b.params}
        self.optimizer.step()
        for future in [self._comm.submit(self._adasum_bucket, b, before) for b in self._buckets]:
            future.result()

    def _adasum_bucket(self, bucket: _buckets.Bucket, before: dict) -> None:
        for p, part in zip(bucket.params, bucket.views()):
            part.copy_((p.detach() - before[p]).reshape(-1))
        joining.agree(self._channel, self._request(joining.ADASUM, bucket.buffer))
        adasum_reduce(bucket.buffer, bucket.sizes, self.compression, self._group)
        with torch.no_grad():  # (grad mode is per thread)
            for p, part in zip(bucket.params, bucket.views()):
                p.copy_(before[p] + part.view(p.shape).to(p.device))


def _check_options(optimizer, compression, backward_passes_per_step, op, gradient_predivide_factor,
                   fusion_threshold_mb) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(compression, Compressor):
        raise TypeError(f"compression must be a Compressor such as Compression.fp16, got {compression!r}")
    if op is not ADASUM and op not in REDUCTIONS:
        raise ValueError(f"op must be ReduceOp.AVG (hvd.Average), ReduceOp.SUM (hvd.Sum) or hvd.Adasum, got {op!r}")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
    if gradient_predivide_factor != 1.0 and op != ReduceOp.AVG:
        raise ValueError(f"gradient_predivide_factor needs op=Average (as in Horovod), got op={op!r}")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}")
    if not fusion_threshold_mb >= 0:
        raise ValueError(f"fusion_threshold_mb must be >= 0, got {fusion_threshold_mb!r}")


def _parent_group(process_set, group):
    """The group whose ranks reduce together, or ``None`` when this rank has nobody to reduce with
    (a group of one, or a process set it is not in: Horovod then steps locally)."""
    if process_set is not None:
        if group is not None:
            raise ValueError("pass process_set= or group=, not both")
        if not process_set.included():
            return None
        parent = process_sets.group_of(process_set)
    else:
        parent = resolve(group) or api.default_group()
    return parent if parent.size > 1 else None


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
