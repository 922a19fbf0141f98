"""ZeRO-style sharding: each rank keeps the optimizer state of only 1/n of the parameters.

Each parameter group's parameters are laid end to end in one flat buffer, zero-padded to a multiple
of the world size ``n``, and the model's parameters become views into it. Rank r owns the r-th
``1/n`` slice, its *shard*: the wrapped optimizer is built over one tensor per group, a copy of the
rank's shard, so every state tensor it creates (momentum, Adam's two moments) has ``numel / n``
elements. A step:

- **stage 1**: all-reduce (average) the flat gradient; every rank keeps the full averaged gradients
  in ``.grad`` and hands its shard's slice to the wrapped optimizer;
- **stage 2**: reduce-scatter the flat gradient instead, so each rank receives only its shard's
  average; the full gradients are then dropped (``.grad = None``) and only the shard's gradient is
  kept (1/n of the gradient memory between steps);
- then the wrapped optimizer updates the shard and an all-gather of the shards writes the new values
  straight into the flat buffer, that is, into every rank's parameters.

Shards split tensors wherever ``1/n`` falls, so the balance is exact to one element. A parameter
without a gradient counts as a zero gradient (as in :func:`DistributedOptimizer`).
"""

from __future__ import annotations

import torch

from ... import api
from ...ops import ReduceOp

from ..c10d.groups import resolve
from ..common.tensors import Staged

STAGES = (1, 2)


class _Shard:
    """One parameter group laid out flat: its buffer, each parameter's place, this rank's slice."""

    def __init__(self, params: list[torch.Tensor], rank: int, size: int):
        first = params[0]
        for p in params:
            if (p.dtype, p.device) != (first.dtype, first.device) or not p.dtype.is_floating_point:
                raise ValueError(f"a ZeRO parameter group needs floating parameters of one dtype and device; "
                                 f"got {first.dtype} on {first.device} and {p.dtype} on {p.device}")
        self.params = params
        self.places = []  # (parameter, its slice of the flat buffer)
        offset = 0
        for p in params:
            self.places.append((p, slice(offset, offset + p.numel())))
            offset += p.numel()
        self.chunk = -(-offset // size)
        self.flat = torch.zeros(self.chunk * size, dtype=first.dtype, device=first.device)
        with torch.no_grad():
            for p, place in self.places:
                view = self.flat[place].view_as(p)
                view.copy_(p)
                p.data = view
        self.lo, self.hi = rank * self.chunk, (rank + 1) * self.chunk
        self.local = torch.nn.Parameter(self.flat[self.lo:self.hi].clone())

    def flat_grad(self) -> torch.Tensor:
        """The parameters' gradients end to end (zeros where missing), padded like ``flat``."""
        grad = torch.zeros_like(self.flat)
        for p, place in self.places:
            if p.grad is not None:
                grad[place] = p.grad.reshape(-1)
        return grad

    def scatter_grad(self, grad: torch.Tensor) -> None:
        """Write ``grad`` (shaped like ``flat``) back into the parameters' gradients."""
        for p, place in self.places:
            part = grad[place].view_as(p)
            if p.grad is None:
                p.grad = part.clone()
            else:
                p.grad.copy_(part)


class ZeroRedundancyOptimizer:
    """Wrap ``optimizer_class`` so that each rank holds the state of only its shard of ``params``.

    Args:
        params: the parameters, or parameter groups (dicts with ``"params"`` and options), as for any
            torch optimizer. Each group must hold floating parameters of one dtype and device.
        optimizer_class: e.g. ``torch.optim.Adam``; built over this rank's shards.
        process_group: an allreduce group, a torch group on the ``"allreduce"`` backend, or ``None``.
        stage: 1 shards optimizer state; 2 also reduce-scatters gradients and keeps only the shard's.
        **defaults: options for ``optimizer_class`` (``lr=...``).

    Gradients are averaged across ranks. The parameters become views into a flat buffer per group.

    Example (every rank)::

        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, stage=2, lr=1e-3)
        loss_fn(model(x), y).backward()
        opt.step()          # every rank's model now holds the same updated weights

    Raises:
        ValueError: an unknown stage, or a parameter group mixing dtypes or devices.
    """

    def __init__(self, params, optimizer_class: type[torch.optim.Optimizer], process_group=None, stage: int = 1,
                 **defaults):
        if stage not in STAGES:
            raise ValueError(f"stage must be 1 (shard optimizer state) or 2 (also gradients), got {stage!r}")
        self.stage = stage
        self.process_group = resolve(process_group)  # the allreduce group (None: the default one)
        rank, size = api.get_rank(self.process_group), api.get_world_size(self.process_group)
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self._shards = []
        local_groups = []
        for group in groups:
            tensors = [p for p in group["params"] if p.requires_grad]
            if not tensors:
                raise ValueError("a ZeRO parameter group has no trainable parameters")
            shard = _Shard(tensors, rank, size)
            self._shards.append(shard)
            local_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [shard.local]})
        self.optimizer = optimizer_class(local_groups, **defaults)

    @property
    def params(self) -> list[torch.Tensor]:
        """The model parameters this optimizer trains (not its shards)."""
        return [p for shard in self._shards for p in shard.params]

    @property
    def param_groups(self) -> list[dict]:
        """The wrapped optimizer's groups (each holds this rank's shard); set ``lr`` here."""
        return self.optimizer.param_groups

    def step(self, closure=None):
        """Average the gradients, update this rank's shards, all-gather the parameters.

        A ``closure`` is evaluated once, first. Returns its loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for shard in self._shards:
            self._reduce_gradients(shard)
        self.optimizer.step()
        for shard in self._shards:
            flat = Staged(shard.flat, copy_in=False)
            api.all_gather_into_tensor(flat.host, Staged(shard.local).host, group=self.process_group)
            flat.copy_back()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients and the shards'."""
        for shard in self._shards:
            for p in shard.params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _reduce_gradients(self, shard: _Shard) -> None:
        grad = Staged(shard.flat_grad())
        if self.stage == 1:
            api.all_reduce(grad.host, ReduceOp.AVG, group=self.process_group)
            grad.copy_back()
            shard.scatter_grad(grad.tensor)
            shard.local.grad = grad.tensor[shard.lo:shard.hi].clone()
            return
        mine = Staged(torch.empty_like(shard.local), copy_in=False)
        api.reduce_scatter_tensor(mine.host, grad.host, ReduceOp.AVG, group=self.process_group)
        mine.copy_back()
        shard.local.grad = mine.tensor
        for p in shard.params:
            p.grad = None
