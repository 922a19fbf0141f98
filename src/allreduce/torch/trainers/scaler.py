"""Dynamic loss scaling for training whose gradients travel (or live) in float16.

Small gradients underflow to zero in float16. Multiplying the loss by a large scale S shifts every
gradient up by S; after the reduction they are divided by S again before the optimizer sees them. If
S is too large a gradient overflows to inf (the fp16 cast on the wire does it too), so: when any
reduced gradient is inf or NaN the step is skipped and S shrinks by ``backoff_factor``; after
``growth_interval`` clean steps in a row S grows by ``growth_factor``. With a
:func:`DistributedOptimizer` every rank checks the same reduced gradients, so every rank makes the
same decision without another message. A :class:`ZeroRedundancyOptimizer` reduces inside its step,
so there the ranks agree on the verdict with a one-element all-reduce first. Any other optimizer is
checked on this rank's gradients as they are (one process, or gradients DDP already averaged).
"""

from __future__ import annotations

import torch

from ... import api
from ...ops import ReduceOp

from .zero import ZeroRedundancyOptimizer


class DynamicLossScaler:
    """Scale the loss up, check and unscale the gradients, step or skip, adapt the scale.

    Example (every rank)::

        scaler = DynamicLossScaler()
        scaler.scale(loss).backward()
        stepped = scaler.step(opt)      # opt: a DistributedOptimizer with Compression.fp16

    Raises:
        ValueError: a non-positive scale, a growth factor <= 1, a backoff factor outside (0, 1).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float = 2.0**-14):
        if not init_scale > 0 or not min_scale > 0:
            raise ValueError(f"init_scale and min_scale must be positive, got {init_scale!r}, {min_scale!r}")
        if not growth_factor > 1:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be an int >= 1, got {growth_interval!r}")
        self.scale_value = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self._clean_steps = 0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``: call ``backward()`` on this."""
        return loss * self.scale_value

    def step(self, optimizer) -> bool:
        """Synchronize ``optimizer`` if it can, then unscale and step, or skip on inf/NaN.

        Returns whether the optimizer stepped. The scale is updated either way.
        """
        synchronize = getattr(optimizer, "synchronize", None)
        if synchronize is not None:
            synchronize()
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            params = optimizer.params
        else:
            params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [p.grad for p in params if p.grad is not None]
        if self._overflowed(grads, optimizer):
            self.scale_value = max(self.scale_value * self.backoff_factor, self.min_scale)
            self._clean_steps = 0
            return False
        for g in grads:
            g.div_(self.scale_value)
        if synchronize is not None:
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
        self._clean_steps += 1
        if self._clean_steps == self.growth_interval:
            self.scale_value *= self.growth_factor
            self._clean_steps = 0
        return True

    def _overflowed(self, grads: list[torch.Tensor], optimizer) -> bool:
        overflow = not all(bool(torch.isfinite(g).all()) for g in grads)
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            return overflow
        flag = torch.tensor([int(overflow)], dtype=torch.int32)
        api.all_reduce(flag, ReduceOp.MAX, group=optimizer.process_group)
        return bool(flag)

    def state_dict(self) -> dict:
        return {"scale": self.scale_value, "clean_steps": self._clean_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale_value = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])
