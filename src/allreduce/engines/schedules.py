"""The schedule engine: runs one rank's schedule of a registered algorithm over any transport.

Each step becomes one ``exchange``: its copies first, then all its sends and receives at once. A
receive that reduces lands in a staging buffer and is combined into its destination in blocks as it
arrives, so reduction overlaps the rest of the transfer (the pipelining inside a step). Staging and
scratch memory is kept between calls: a steady stream of collectives allocates nothing. A call
shape's schedule and its steps are worked out once, when it is planned.

The root of a broadcast or scatter receives nothing, so a root that disagreed with the others would
return as if all were well: its schedule therefore ends with one empty frame from the next rank,
whose header the root checks (see :func:`_confirmed`).

An exception of the caller's that escapes mid-schedule (``KeyboardInterrupt``, a signal handler's) leaves
the peers mid-step and frames half sent; it is raised as :class:`~.errors.Interrupted` (its cause the
original), so that the group breaks and tells the peers, as after a communication error.
"""

from __future__ import annotations

import functools
import time
from typing import Any
from collections.abc import Callable

import numpy as np

from .. import algorithms, collectives
from ..algorithms.schedule import Copy, Recv, Region, Schedule, Send
from ..ops import kernel
from ..transport import RecvSpec, SendSpec, Transport
from .call import Call, Idle, reworded

_REDUCE_BLOCK = 1 << 16  # bytes reduced at a time while a segment is still arriving


class ScheduleEngine:
    """Plans and runs schedules for one rank of one group over ``transport``."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.scratch = Scratch()

    def plan(self, entry: algorithms.Algorithm, call: Call, options: dict[str, Any]) -> Scheduled:
        """``call`` as ``entry``'s schedule for this rank, its steps worked out (see :func:`steps_of`)."""
        return Scheduled(self, call, schedule_for(entry, call, self.transport.rank, self.transport.size, options))

    def close(self) -> None:
        """Nothing to drop: schedules hold no view of the transport."""

    def execute(self, planned: Scheduled, buffers: dict[str, np.ndarray], seq: int, timeout: float,
                idle: Idle = None, idle_every: float = 1.0) -> None:
        """Run ``planned`` as call ``seq`` on the flat arrays in ``buffers`` (``data``, ``out``); ``tmp`` is
        provided here. See :meth:`Planned.run <allreduce.engines.Planned.run>`."""
        call, schedule = planned.call, planned.schedule
        deadline = time.monotonic() + timeout
        arrays = dict(buffers, tmp=self.scratch.tmp(schedule.tmp * call.dtype.itemsize).view(call.dtype))
        raw = {name: a.view(np.uint8).data for name, a in arrays.items()}
        itemsize = call.dtype.itemsize
        ufunc = planned.ufunc
        header = call.headers(seq)
        index = 0
        try:
            for index, copies, sends, recvs in planned.steps:
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
                                       arrays[dst.buf][dst.start:dst.stop],
                                       self.scratch.stage(slot, dst.count * itemsize).view(call.dtype))
                    if later:
                        deferred.append(reducer)
                    recv_specs.append(RecvSpec(peer, header(index, reducer.dest.nbytes), reducer.dest,
                                               None if later else reducer.progress, reducer.absorb))
                self.transport.exchange(send_specs, recv_specs, deadline, idle, idle_every)
                for reducer in deferred:
                    reducer.progress(reducer.dest.nbytes)
        except BaseException as exc:
            where = f"{call.collective} #{seq} ({call.algorithm}, step {index + 1}/{len(schedule.steps)})"
            raise reworded(exc, where, timeout) from exc



class Scratch:
    """An engine's scratch (``tmp``) and staging memory, kept between calls: it only grows, so that a
    steady stream of collectives allocates nothing. ``grown`` counts the times it did."""

    def __init__(self) -> None:
        self._tmp = np.empty(0, np.uint8)
        self._staging: list[np.ndarray] = []
        self.grown = 0

    def tmp(self, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of the scratch buffer, as bytes."""
        if self._tmp.nbytes < nbytes:
            self._tmp, self.grown = np.empty(nbytes, np.uint8), self.grown + 1
        return self._tmp[:nbytes]

    def stage(self, slot: int, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of staging buffer ``slot`` (a receive's place in its step), as bytes."""
        while slot >= len(self._staging):
            self._staging.append(np.empty(0, np.uint8))
        if self._staging[slot].nbytes < nbytes:
            self._staging[slot], self.grown = np.empty(nbytes, np.uint8), self.grown + 1
        return self._staging[slot][:nbytes]


class _Reducer:
    """Combines a segment into its destination block by block as its bytes arrive."""

    __slots__ = ("ufunc", "acc", "out", "stage", "dest", "done", "itemsize", "count")

    def __init__(self, ufunc: Callable[..., np.ndarray], acc: np.ndarray, out: np.ndarray, stage: np.ndarray):
        self.ufunc, self.acc, self.out, self.stage = ufunc, acc, out, stage
        self.dest = stage.view(np.uint8).data
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


class Scheduled:
    """A call shape planned on the schedule engine: its schedule, its steps and its reduce kernel."""

    __slots__ = ("engine", "call", "schedule", "steps", "ufunc")

    def __init__(self, engine: ScheduleEngine, call: Call, schedule: Schedule):
        self.engine, self.call, self.schedule = engine, call, schedule
        self.steps = steps_of(schedule)
        self.ufunc = kernel(call.op, call.dtype)

    def run(self, buffers: dict[str, np.ndarray], seq: int, timeout: float, idle: Idle = None,
            idle_every: float = 1.0) -> None:
        """See :meth:`Planned.run <allreduce.engines.Planned.run>`."""
        self.engine.execute(self, buffers, seq, timeout, idle, idle_every)


def schedule_for(entry: algorithms.Algorithm, call: Call, rank: int, size: int, options: dict[str, Any]) -> Schedule:
    """This rank's schedule of ``call`` by ``entry`` with the group's ``options``: the algorithm's own, or
    for a collective whose root only sends, the confirmed one (see :func:`_confirmed`)."""
    if collectives.get(call.collective).root_sends_only and size > 1:
        return _confirmed(entry, rank, size, call.count, call.root, **options)
    return entry(rank, size, call.count, root=call.root, **options)


def steps_of(schedule: Schedule) -> tuple[Any, ...]:
    """The schedule's non-empty steps as ``(index, copies, sends, receives)`` tuples, worked out once per planned call.

    A receive is ``(peer, dst, reduce, later)``: ``later`` marks a second reduce into a region another
    receive of the step reduces into; it is combined after the exchange, so the order of combination
    is the schedule's, not the network's, and every run gives the same bits.
    """
    steps = []
    for index, step in enumerate(schedule.steps):
        if not step:
            continue
        copies = tuple((op.src, op.dst, op.reduce) for op in step if isinstance(op, Copy))
        sends = tuple((op.peer, op.src) for op in step if isinstance(op, Send))
        recvs: list[tuple[int, Region, Any, bool]] = []
        reducing: list[Region] = []
        for op in step:
            if isinstance(op, Recv):
                later = op.reduce is not None and any(op.dst.overlaps(other) for other in reducing)
                if op.reduce is not None:
                    reducing.append(op.dst)
                recvs.append((op.peer, op.dst, op.reduce, later))
        steps.append((index, copies, sends, tuple(recvs)))
    return tuple(steps)


@functools.lru_cache(maxsize=1024)
def _confirmed(entry: algorithms.Algorithm, rank: int, size: int, count: int, root: int, **options: Any) -> Schedule:
    """The algorithm's schedule plus a last step: an empty frame from the rank after ``root`` to ``root``.

    Its header carries the sender's fingerprint, so a root whose src, collective, count or dtype
    differs from the others' hears of it in this collective instead of never.
    """
    schedule = entry(rank, size, count, root=root, **options)
    nothing = Region("tmp", 0, 0)
    last: tuple[Recv | Send, ...]
    if rank == root:
        last = (Recv((root + 1) % size, nothing),)
    elif rank == (root + 1) % size:
        last = (Send(root, nothing),)
    else:
        return schedule
    return Schedule(schedule.steps + (last,), schedule.tmp)
