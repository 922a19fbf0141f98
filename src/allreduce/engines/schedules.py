"""Runs one rank's schedule over a transport.

Each step becomes one ``exchange``: its copies first, then all its sends and receives at once. A
receive that reduces lands in a staging buffer and is combined into its destination in blocks as it
arrives, so reduction overlaps the rest of the transfer (the pipelining inside a step). Staging and
scratch memory is kept between calls: a steady stream of collectives allocates nothing.

An exception of the caller's that escapes mid-schedule (``KeyboardInterrupt``, a signal handler's) leaves
the peers mid-step and frames half sent; it is raised as :class:`~.errors.Interrupted` (its cause the
original), so that the group breaks and tells the peers, as after a communication error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import collectives, wire
from ..algorithms.schedule import Copy, Recv, Schedule, Send
from ..dtypes import code_of
from ..errors import AllreduceError, CommTimeout, Interrupted
from ..ops import ReduceOp, kernel
from ..transport import RecvSpec, SendSpec, Transport

_REDUCE_BLOCK = 1 << 16  # bytes reduced at a time while a segment is still arriving


@dataclass(frozen=True)
class Call:
    """One collective call as every rank must agree on it (its fingerprint) plus how it runs."""

    collective: str  # a name in allreduce.collectives
    seq: int  # per-group sequence number (per-peer counter for send/recv)
    algorithm: str
    dtype: np.dtype
    op: ReduceOp
    count: int  # the collective's count, as the schedule function received it
    root: int = 0  # root rank, or the tag of a send/recv
    digest: int = 0  # wire.algorithm_digest of the algorithm and options: ranks whose schedules differ disagree here

    def headers(self):
        """A function ``(step, nbytes) -> Header`` for this call's frames."""
        kind, collective = wire.DATA, collectives.get(self.collective).code
        dtype, op, root, count, make = code_of(self.dtype), int(self.op), self.root, self.count, wire.Header
        seq, digest = self.seq % wire.SEQ_MODULUS, self.digest

        def header(step: int, nbytes: int) -> wire.Header:
            return make(kind, collective, dtype, op, root, step, seq, count, nbytes, digest)

        return header


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
        re-worded to name the collective and the step, and :class:`Interrupted` for any other exception
        (see the module docstring). ``idle`` is handed to the transport.
        """
        deadline = time.monotonic() + timeout
        arrays = dict(buffers, tmp=self._scratch_for(schedule.tmp, call.dtype))
        raw = {name: memoryview(a.view(np.uint8)) for name, a in arrays.items()}
        itemsize = call.dtype.itemsize
        ufunc = kernel(call.op)
        header = call.headers()
        steps = _plan(schedule)
        index = 0
        try:
            for index, copies, sends, recvs in steps:
                for src, dst, acc in copies:
                    if acc is None:
                        np.copyto(arrays[dst.buf][dst.start:dst.stop], arrays[src.buf][src.start:src.stop])
                    else:  # a reducing copy: dst = acc (op) src, in the schedule's order
                        ufunc(arrays[acc.buf][acc.start:acc.stop], arrays[src.buf][src.start:src.stop],
                              out=arrays[dst.buf][dst.start:dst.stop])
                send_specs = []
                for peer, src in sends:
                    payload = raw[src.buf][src.start * itemsize:src.stop * itemsize]
                    send_specs.append(SendSpec(peer, header(index, payload.nbytes), payload))
                recv_specs, deferred = [], []
                for slot, (peer, dst, acc, later) in enumerate(recvs):
                    if acc is None:
                        dest = raw[dst.buf][dst.start * itemsize:dst.stop * itemsize]
                        recv_specs.append(RecvSpec(peer, header(index, dest.nbytes), dest))
                        continue
                    reducer = _Reducer(ufunc, arrays[acc.buf][acc.start:acc.stop],
                                       arrays[dst.buf][dst.start:dst.stop], self._stage(slot, dst.count, call.dtype))
                    if later:
                        deferred.append(reducer)
                    recv_specs.append(RecvSpec(peer, header(index, reducer.dest.nbytes), reducer.dest,
                                               None if later else reducer.progress, reducer.absorb))
                self.transport.exchange(send_specs, recv_specs, deadline, idle, idle_every)
                for reducer in deferred:
                    reducer.progress(reducer.dest.nbytes)
        except BaseException as exc:
            where = f"{call.collective} #{call.seq} ({call.algorithm}, step {index + 1}/{len(schedule.steps)})"
            raise reworded(exc, where, timeout) from exc

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

    def absorb(self, view: memoryview, offset: int) -> None:
        """Combine incoming bytes straight from the transport's memory (no staging copy)."""
        a = offset // self.itemsize
        b = a + view.nbytes // self.itemsize
        self.ufunc(self.acc[a:b], np.frombuffer(view, self.stage.dtype), out=self.out[a:b])
        self.done = b


_PLANS: dict[int, tuple] = {}


def _plan(schedule: Schedule) -> tuple:
    """The schedule's non-empty steps as ``(index, copies, sends, receives)`` tuples, worked out once.

    A receive is ``(peer, dst, reduce, later)``: ``later`` marks a second reduce into a region another
    receive of the step reduces into; it is combined after the exchange, so the order of combination
    is the schedule's, not the network's, and every run gives the same bits.
    """
    cached = _PLANS.get(id(schedule))
    if cached is not None and cached[0] is schedule:
        return cached[1]
    steps = []
    for index, step in enumerate(schedule.steps):
        if not step:
            continue
        copies = tuple((op.src, op.dst, op.reduce) for op in step if isinstance(op, Copy))
        sends = tuple((op.peer, op.src) for op in step if isinstance(op, Send))
        recvs, reducing = [], []
        for op in step:
            if isinstance(op, Recv):
                later = op.reduce is not None and any(op.dst.overlaps(other) for other in reducing)
                if op.reduce is not None:
                    reducing.append(op.dst)
                recvs.append((op.peer, op.dst, op.reduce, later))
        steps.append((index, copies, sends, tuple(recvs)))
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[id(schedule)] = (schedule, tuple(steps))
    return _PLANS[id(schedule)][1]


def reworded(exc: BaseException, where: str, timeout: float) -> AllreduceError:
    """The error a collective raises when ``exc`` escapes it at ``where``: :class:`Interrupted` for the
    caller's own exception (see the module docstring), else the same kind of error with the collective
    and step in front of the transport's words."""
    if not isinstance(exc, AllreduceError):
        return Interrupted(f"{where} was interrupted by {type(exc).__name__}")
    if isinstance(exc, CommTimeout):
        where += f" timed out after {timeout:g}s"
    new = type(exc)(f"{where} {exc}" if isinstance(exc, CommTimeout) else f"{where}: {exc}")
    new.peer = getattr(exc, "peer", None)
    return new
