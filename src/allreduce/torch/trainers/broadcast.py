"""Start every rank from the same model and optimizer state as ``root_rank``.

Parameters are broadcast in place, tensor by tensor (all issued at once, completed in order).
Optimizer state is a tree of tensors and numbers whose shape may differ between ranks (a rank that
has not stepped yet has no state at all), so the root serializes its ``state_dict()`` with
``torch.save`` and broadcasts the bytes (length first); the others load it with ``weights_only=True``,
which accepts tensors and plain containers only.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import torch

from ... import api

from ..c10d.groups import resolve
from ..common.tensors import Staged
from .wrapped import WrappedOptimizer


def broadcast_parameters(params, root_rank: int = 0, group=None) -> None:
    """Overwrite ``params`` on every rank with ``root_rank``'s values.

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()``, or an iterable of tensors.
        root_rank: the rank whose values win.
        group: an allreduce group, a torch group on the ``"allreduce"`` backend, or ``None``.

    Example (two ranks)::

        broadcast_parameters(model.state_dict(), root_rank=0)   # both now hold rank 0's weights
    """
    items = params.values() if isinstance(params, Mapping) else params
    tensors = [item[1] if isinstance(item, tuple) else item for item in items]
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters takes tensors, got {type(t).__name__}")
    g = resolve(group)
    staged = [Staged(t) for t in tensors]
    works = [api.broadcast(s.host, root_rank, group=g, async_op=True) for s in staged]
    for work, s in zip(works, staged):
        work.wait()
        s.copy_back()


def broadcast_optimizer_state(optimizer, root_rank: int = 0, group=None) -> None:
    """Load ``root_rank``'s optimizer state (``state_dict()``) into ``optimizer`` on every rank.

    ``optimizer`` is a ``torch.optim.Optimizer`` (one that :func:`DistributedOptimizer` returned too);
    every rank's must have the same parameter groups. As in Horovod, an optimizer that has no state yet
    first takes one step of its own (no reduction) on zero gradients, which creates its state (momentum
    buffers, step counts): every parameter that requires a gradient is left with a zero ``grad``.

    Example (two ranks)::

        broadcast_optimizer_state(opt, root_rank=0)   # e.g. after rank 0 loaded a checkpoint
    """
    g = resolve(group)
    if not optimizer.state_dict()["state"]:
        _create_state(optimizer.optimizer if isinstance(optimizer, WrappedOptimizer) else optimizer)
    root = api.get_rank(g) == root_rank
    if root:
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    length = torch.tensor([data.numel() if root else 0], dtype=torch.int64)
    api.broadcast(length, root_rank, group=g)
    if not root:
        data = torch.empty(int(length), dtype=torch.uint8)
    api.broadcast(data, root_rank, group=g)
    if not root:
        optimizer.load_state_dict(torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True))


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """One step of ``optimizer`` on zero gradients (Horovod's way to give a new optimizer its state)."""
    for param_group in optimizer.param_groups:
        for p in param_group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    optimizer.step()
