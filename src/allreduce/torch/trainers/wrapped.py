"""What both distributed optimizers are: a ``torch.optim.Optimizer`` that *is* the optimizer it wraps,
with a thread and a group of its own for the gradients' collectives.

Composition: the user's optimizer object is kept as it is, and the wrapper's ``param_groups``,
``state`` and ``defaults`` are the wrapped one's, so LR schedulers, ``GradScaler`` and ``isinstance``
checks accept it. Collectives run on one communication thread, on a twin of the caller's group that
it formed (:mod:`.twins`: a group serves one thread at a time), so collectives the caller issues
meanwhile cannot interleave with them. Parameters are laid out in fusion buckets (:mod:`.buckets`),
the messages the gradients (or Adasum's parameter changes) travel in. Under ``hvd.init`` that group
is also a ``join`` channel: every reduction is first announced to joined ranks.
"""

from __future__ import annotations

import concurrent.futures
import threading

import torch

from ... import api
from ...errors import AllreduceError

from ..c10d.groups import resolve
from ..common.compression import Compressor
from ..horovod import joining, process_sets
from . import buckets as _buckets
from .twins import twin

DEFAULT_FUSION_MB = 25.0  # bucket size; gradients of a model smaller than this travel as one message


class WrappedOptimizer(torch.optim.Optimizer):
    """The wrapping, the communication thread, the gradient group and the buckets; the arguments are
    :func:`~allreduce.torch.trainers.optimizer.DistributedOptimizer`'s (``groups``: explicit groups)."""

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters, compression: Compressor,
                 backward_passes_per_step: int, op, gradient_predivide_factor: float, groups, process_set,
                 fusion_threshold_mb: float, group):
        _check_options(optimizer, compression, gradient_predivide_factor, fusion_threshold_mb)
        check_passes(backward_passes_per_step)
        self.optimizer = optimizer
        super().__setstate__({})  # a torch Optimizer's hook tables; its __init__ would replace param_groups
        self.compression = compression
        self.op = op
        self.backward_passes_per_step = backward_passes_per_step
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self._groups = groups
        self._threshold = int(fusion_threshold_mb * 2**20)
        named = _named(optimizer, named_parameters)
        self._parameter_names = {p: name for name, p in named}  # Horovod's attribute, which ported scripts read
        parent = _parent_group(process_set, group)
        self._lock = threading.Lock()
        self._comm = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="allreduce-grads")
        self._group = self._comm.submit(twin, parent, "grads").result() if parent is not None else None
        self._channel = joining.open_channel(self._group, self._comm.submit) if self._group is not None else None
        self._in_flight: list[concurrent.futures.Future] = []
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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; refused while reductions are in flight (they would write into them).

        Raises:
            RuntimeError: reductions launched by backward have not been waited for by ``step()``/``synchronize()``.
        """
        if self.in_flight:
            raise RuntimeError("zero_grad() called while gradient reductions are in flight; call step() or "
                               "synchronize() first (or zero_grad() before backward)")
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # ---- communication ---------------------------------------------------------------------------

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
        check_passes(passes)
        self.backward_passes_per_step = passes
        self._reset()

    def close(self) -> None:
        """Close the gradient group and stop the communication thread once the reductions in flight
        are done.

        Buckets still waiting for gradients are not launched: every rank may close at any time.
        Raises the error of a reduction that failed in flight.
        """
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

    def regroup(self) -> None:
        """Reduce over the default group as it is now (Horovod's elastic reset formed a new one): the
        old gradient group is closed and its failed reductions dropped, a new one formed (every rank
        of the new default group calls it). For an optimizer built on the default group."""
        joining.close_channel(self._channel)
        with self._lock:
            self._in_flight = []
        if self._group is not None:
            try:
                self._comm.submit(self._group.close).result()
            except (AllreduceError, OSError):  # its peers died: nothing left to close cleanly
                pass
        parent = _parent_group(None, None)
        self._group = self._comm.submit(twin, parent, "grads").result() if parent is not None else None
        self._channel = joining.open_channel(self._group, self._comm.submit) if self._group is not None else None
        self._arrange(self._named)

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, compression={self.compression!r}, "
                f"op={getattr(self.op, 'name', self.op)}, buckets={len(self._buckets)})")

    def _arrange(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Lay ``named`` out in buckets."""
        self._named = named
        groups = _buckets.explicit_groups([p for _, p in named], self._groups)
        self._buckets = (_buckets.assign(named, self._threshold) if groups is None
                         else _buckets.assign_groups(named, groups))
        self._reset()

    def _reset(self) -> None:
        """Forget what was counted since the last synchronization (subclasses that count say what)."""

    def _agree(self, kind: int, op, flat: torch.Tensor) -> None:
        """Announce the reduction of ``flat`` to joined ranks (nothing to do outside ``hvd.init``)."""
        wire = self.compression.wire_dtype_for(flat.dtype)
        joining.agree(self._channel, joining.Reduction(kind, flat.numel(), flat.dtype, op, wire))


def evaluate(closure):
    """The loss of ``step(closure)``'s ``closure``, evaluated once with gradients on (``None`` without one)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def check_passes(backward_passes_per_step) -> None:
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")


def _check_options(optimizer, compression, gradient_predivide_factor, fusion_threshold_mb) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(compression, Compressor):
        raise TypeError(f"compression must be a Compressor such as Compression.fp16, got {compression!r}")
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
