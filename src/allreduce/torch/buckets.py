"""Tensor fusion: gradients packed into a few flat buffers, each all-reduced as one message.

Many small all-reduces cost a latency each; one big one cannot start until the whole backward pass
is done. Buckets sit between: parameters are taken in *reverse* registration order (roughly the order
backward produces their gradients) and packed into a bucket until it holds ``threshold`` bytes, so
the last layers' bucket is ready early and travels while the first layers still compute. A bucket
holds parameters of one dtype and device only. The assignment depends only on the parameters'
order, shapes and dtypes, so every rank of a data-parallel job builds the same buckets.
"""

from __future__ import annotations

import torch

from .tensors import host_buffer


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
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def pack(self) -> None:
        """Copy every parameter's gradient into the buffer (zeros for a parameter without one)."""
        for p, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            part = self.buffer[start:stop]
            if p.grad is None:
                part.zero_()
            else:
                part.copy_(p.grad.reshape(-1))

    def unpack(self) -> None:
        """Copy the buffer back into the gradients, creating those that were missing."""
        for p, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            part = self.buffer[start:stop].view(p.shape)
            if p.grad is None:
                p.grad = part.to(p.device, copy=True)
            else:
                p.grad.copy_(part)

    def __repr__(self) -> str:
        return f"<Bucket {self.index}: {len(self.params)} tensors, {self.nbytes} bytes, {self.names[0]}...>"


def assign(params: list[tuple[str, torch.Tensor]], threshold: int) -> list[Bucket]:
    """Pack ``params`` (in registration order) into buckets of about ``threshold`` bytes, last first."""
    groups: list[list[tuple[str, torch.Tensor]]] = []
    size = 0
    for name, p in reversed(params):
        current = groups[-1] if groups else None
        if current is None or size >= threshold or _kind(current[0][1]) != _kind(p):
            groups.append([])
            size = 0
        groups[-1].append((name, p))
        size += p.numel() * p.element_size()
    return [Bucket(i, group) for i, group in enumerate(groups)]


def _kind(p: torch.Tensor) -> tuple:
    return p.dtype, p.device
