"""A model for the schedule walker (``allreduce.algorithms.verify.walk``) with real numbers: every
rank's buffers are numpy arrays, and copies, reducing copies and receives are applied as the executor
applies them (``dst = reduce (op) other``, the accumulator on the left), to see the bits each rank
ends with."""

from __future__ import annotations

import numpy as np

from allreduce.algorithms.schedule import Copy, Recv, Region
from allreduce.ops import ReduceOp, kernel


class Numeric:
    """``buffers[rank][buf]`` are the ranks' arrays; ``op`` is the reduction."""

    def __init__(self, buffers: list[dict[str, np.ndarray]], op: ReduceOp = ReduceOp.SUM):
        self.buffers = buffers
        self.ufunc = kernel(op, next(a for a in buffers[0].values()).dtype)

    def view(self, rank: int, reg: Region) -> np.ndarray:
        return self.buffers[rank][reg.buf][reg.start:reg.stop]

    def read(self, rank: int, src: Region) -> np.ndarray:
        return self.view(rank, src).copy()

    def copy(self, rank: int, op: Copy) -> None:
        self._combine(rank, op.dst, op.reduce, self.view(rank, op.src))

    def receive(self, rank: int, op: Recv, payload: np.ndarray) -> None:
        self._combine(rank, op.dst, op.reduce, payload)

    def _combine(self, rank: int, dst: Region, reduce: Region | None, values: np.ndarray) -> None:
        if reduce is None:
            self.view(rank, dst)[:] = values
        else:
            self.ufunc(self.view(rank, reduce), values, out=self.view(rank, dst))
