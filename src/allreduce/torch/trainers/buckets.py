"""Tensor fusion: gradients packed into a few flat buffers, each all-reduced as one message.

Many small all-reduces cost a latency each; one big one cannot start until the whole backward pass
is done. Buckets sit between: parameters are taken in *reverse* registration order (roughly the order
backward produces their gradients) and packed into a bucket until it holds ``threshold`` bytes, so
the last layers' bucket is ready early and travels while the first layers still compute. A bucket
holds parameters of one dtype and device only. The assignment depends only on the parameters'
order, shapes and dtypes, so every rank of a data-parallel job builds the same buckets.

Horovod's explicit ``groups`` replace the size rule (:func:`assign_groups`): each group of parameters
travels as one bucket (split only where dtypes or devices differ), whatever its size.

Sparse gradients (``nn.Embedding(sparse=True)``) travel dense in their bucket and are handed back
sparse, which is what Horovod does with ``sparse_as_dense=True``.
"""

from __future__ import annotations

import torch

from ..common.tensors import host_buffer


class Bucket:
    """A flat host buffer for the gradients of ``params`` (a list of ``(name, parameter)``)."""

    def __init__(self, index: int, params: list[tuple[str, torch.Tensor]]):
        self.index = index
        self.names = [name for name, _ in params]
        self.params = [p for _, p in params]
        first = self.params[0]
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.buffer = host_buffer(self.offsets[-1], first.dtype, first.device)

    @property
    def sizes(self) -> list[int]:
        """Elements of each parameter, in bucket order (the segments of a per-tensor reduction)."""
        return [stop - start for start, stop in zip(self.offsets, self.offsets[1:])]

    def views(self) -> list[torch.Tensor]:
        """The flat slice of the buffer that holds each parameter's values."""
        return [self.buffer[start:stop] for start, stop in zip(self.offsets, self.offsets[1:])]

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def pack(self) -> None:
        """Copy every parameter's gradient into the buffer (zeros for a parameter without one)."""
        for p, part in zip(self.params, self.views()):
            if p.grad is None:
                part.zero_()
            else:
                part.copy_((p.grad.to_dense() if p.grad.is_sparse else p.grad).reshape(-1))

    def unpack(self) -> None:
        """Copy the buffer back into the gradients, creating those that were missing."""
        for p, part in zip(self.params, self.views()):
            part = part.view(p.shape)
            if p.grad is None:
                p.grad = part.to(p.device, copy=True)
            elif p.grad.is_sparse:
                p.grad = part.to(p.device, copy=True).to_sparse()
            else:
                p.grad.copy_(part)

    def __repr__(self) -> str:
        return f"<Bucket {self.index}: {len(self.params)} tensors, {self.nbytes} bytes, {self.names[0]}...>"


def assign(params: list[tuple[str, torch.Tensor]], threshold: float) -> list[Bucket]:
    """Pack ``params`` (in registration order) into buckets of about ``threshold`` bytes, last first."""
    return [Bucket(i, members) for i, members in enumerate(_pack(params[::-1], threshold))]


def assign_groups(params: list[tuple[str, torch.Tensor]], groups: list[list[torch.Tensor]]) -> list[Bucket]:
    """One bucket per group of ``groups`` (which together hold every parameter of ``params`` once),
    the group holding the latest-registered parameter first."""
    position = {p: i for i, (_, p) in enumerate(params)}
    ordered = sorted(groups, key=lambda group: -max(position[p] for p in group))
    latest_first = [[params[i] for i in sorted((position[p] for p in group), reverse=True)] for group in ordered]
    packed = [members for group in latest_first for members in _pack(group, float("inf"))]
    return [Bucket(i, members) for i, members in enumerate(packed)]


def explicit_groups(params: list[torch.Tensor], groups) -> list[list[torch.Tensor]] | None:
    """Horovod's ``groups`` option as lists of ``params`` (``None``: no explicit groups).

    ``groups`` is ``None``/0, a count ``k`` (:func:`split_evenly`), or lists of parameters; parameters
    that are not in ``params`` are ignored and those in no list form groups of their own.

    Raises:
        ValueError: a negative count, an item that is not a tensor, or a parameter in two lists.
    """
    if not groups:
        return None
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups must be a non-negative int or a list of lists of tensors, got {groups}")
        return split_evenly(params, groups)
    members, listed = set(params), set()
    chosen = []
    for group in groups:
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"groups must hold tensors, got {type(p).__name__}")
            if p in listed:
                raise ValueError("a parameter can only appear once in groups")
            listed.add(p)
        chosen.append([p for p in group if p in members])
    return [g for g in chosen if g] + [[p] for p in params if p not in listed]


def split_evenly(params: list[torch.Tensor], count: int) -> list[list[torch.Tensor]]:
    """``params`` cut into ``count`` consecutive runs whose lengths differ by at most one, the longer
    ones first (Horovod's ``groups=<int>``)."""
    base, extra = divmod(len(params), count)
    bounds = [i * base + min(i, extra) for i in range(count + 1)]
    return [params[lo:hi] for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def _pack(params: list[tuple[str, torch.Tensor]], threshold: float) -> list[list[tuple[str, torch.Tensor]]]:
    """``params`` in order, cut where a run reaches ``threshold`` bytes or the dtype or device changes."""
    runs: list[list[tuple[str, torch.Tensor]]] = []
    size = 0
    for name, p in params:
        if not runs or size >= threshold or _kind(runs[-1][0][1]) != _kind(p):
            runs.append([])
            size = 0
        runs[-1].append((name, p))
        size += p.numel() * p.element_size()
    return runs


def _kind(p: torch.Tensor) -> tuple:
    return p.dtype, p.device
