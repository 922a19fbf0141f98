"""Runs one rank's schedule over a transport.

Each step becomes one ``exchange``: its copies first, then all its sends and receives at once. A
receive that reduces lands in a staging buffer and is combined into its destination in blocks as it
arrives, so reduction overlaps the rest of the transfer (the pipelining inside a step). Staging and
scratch memory is kept between calls: a steady stream of collectives allocates nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import wire
from .algorithms.schedule import Copy, Recv, Region, Schedule, Send
from .dtypes import code_of
from .errors import AllreduceError, CommTimeout
from .ops import ReduceOp, kernel
from .transport import RecvSpec, SendSpec, Transport

_REDUCE_BLOCK = 1 << 16  # bytes reduced at a time while a segment is still arriving


@dataclass(frozen=True)
class Call:
    """One collective call as every rank must agree on it (its fingerprint) plus how it runs."""

    collective: str  # a name in wire.COLLECTIVES
    seq: int  # per-group sequence number (per-peer counter for send/recv)
    algorithm: str
    dtype: np.dtype
    op: ReduceOp
    count: int  # the collective's count, as the schedule function received it
    root: int = 0  # root rank, or the tag of a send/recv

    def header(self, step: int, nbytes: int) -> wire.Header:
        return wire.Header(
            wire.DATA, wire.COLLECTIVES.index(self.collective), code_of(self.dtype), int(self.op),
            self.root, step, self.seq, self.count, nbytes,
        )


class Executor:
    """Executes schedules for one rank of one group over ``transport``."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self._scratch = np.empty(0, np.uint8)
        self._staging: list[np.ndarray] = []

    def run(self, schedule: Schedule, buffers: dict[str, np.ndarray], call: Call, timeout: float,
            idle=None, idle_every: float = 1.0) -> None:
        """Run ``schedule`` on the flat arrays in ``buffers`` (``data``, ``out``); ``tmp`` is provided here.

        The whole schedule must finish within ``timeout`` seconds. Raises the transport's errors
        re-worded to name the collective and the step. ``idle`` is handed to the transport.
        """
        deadline = time.monotonic() + timeout
        buffers = dict(buffers, tmp=self._scratch_for(schedule.tmp, call.dtype))
        ufunc = kernel(call.op)
        nsteps = len(schedule.steps)
        for index, step in enumerate(schedule.steps):
            if not step:
                continue
            sends, recvs, staged, deferred = [], [], [], []
            for op in step:
                if isinstance(op, Copy):
                    np.copyto(_view(buffers, op.dst), _view(buffers, op.src))
            for op in step:
                if isinstance(op, Send):
                    payload = _bytes(buffers, op.src)
                    sends.append(SendSpec(op.peer, call.header(index, payload.nbytes), payload))
                elif isinstance(op, Recv):
                    if op.reduce is None:
                        dest = _bytes(buffers, op.dst)
                        recvs.append(RecvSpec(op.peer, call.header(index, dest.nbytes), dest))
                    else:
                        reducer = _Reducer(ufunc, _view(buffers, op.reduce), _view(buffers, op.dst),
                                           self._stage(len(staged), op.dst.count, call.dtype))
                        # a second reduce into the same region waits for the exchange to end, so the
                        # order of combination is the schedule's, not the network's: same bits every run
                        later = any(op.dst.overlaps(other.dst) for other, _ in staged)
                        staged.append((op, reducer))
                        if later:
                            deferred.append(reducer)
                        recvs.append(RecvSpec(op.peer, call.header(index, reducer.dest.nbytes),
                                              reducer.dest, None if later else reducer.progress))
            try:
                self.transport.exchange(sends, recvs, deadline, idle, idle_every)
            except AllreduceError as exc:
                where = f"{call.collective} #{call.seq} ({call.algorithm}, step {index + 1}/{nsteps})"
                if isinstance(exc, CommTimeout):
                    where += f" timed out after {timeout:g}s"
                raise _reworded(exc, where) from exc
            for reducer in deferred:
                reducer.progress(reducer.dest.nbytes)

    def _scratch_for(self, count: int, dtype: np.dtype) -> np.ndarray:
        nbytes = count * dtype.itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes].view(dtype)

    def _stage(self, slot: int, count: int, dtype: np.dtype) -> np.ndarray:
        nbytes = count * dtype.itemsize
        if slot == len(self._staging):
            self._staging.append(np.empty(0, np.uint8))
        if self._staging[slot].nbytes < nbytes:
            self._staging[slot] = np.empty(nbytes, np.uint8)
        return self._staging[slot][:nbytes].view(dtype)


class _Reducer:
    """Combines a segment into its destination block by block as its bytes arrive."""

    __slots__ = ("ufunc", "acc", "out", "stage", "dest", "done", "itemsize", "count")

    def __init__(self, ufunc, acc: np.ndarray, out: np.ndarray, stage: np.ndarray):
        self.ufunc, self.acc, self.out, self.stage = ufunc, acc, out, stage
        self.dest = memoryview(stage.view(np.uint8))
        self.done = 0
        self.itemsize = stage.itemsize
        self.count = stage.size

    def progress(self, nbytes: int) -> None:
        ready = nbytes // self.itemsize
        if ready == self.count or (ready - self.done) * self.itemsize >= _REDUCE_BLOCK:
            a, b = self.done, ready
            self.ufunc(self.acc[a:b], self.stage[a:b], out=self.out[a:b])
            self.done = ready


def _view(buffers: dict[str, np.ndarray], r: Region) -> np.ndarray:
    return buffers[r.buf][r.start:r.stop]


def _bytes(buffers: dict[str, np.ndarray], r: Region) -> memoryview:
    return memoryview(buffers[r.buf][r.start:r.stop].view(np.uint8))


def _reworded(exc: AllreduceError, where: str) -> AllreduceError:
    """The same kind of error, with the collective and step in front of the transport's words."""
    new = type(exc)(f"{where} {exc}" if isinstance(exc, CommTimeout) else f"{where}: {exc}")
    new.peer = getattr(exc, "peer", None)
    return new
