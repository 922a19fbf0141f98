"""The lines engine: the lines algorithms run on the shared-memory lines, a ready plan per call shape.

A group whose ranks all share one host has *lines* (:mod:`..transport.shm.linepath`): each rank writes
its contribution into its line, waits for its peers' lines and reads them in place, with no frames
and no schedule to walk. ``lines`` (one round, up to ``line_max`` bytes per rank) serves all-reduce,
reduce, broadcast, all-gather and barrier; ``chunked_lines`` (two rounds per chunk of a line) serves
larger all-reduces and reduces: each rank folds its own slice of every chunk, then all copy the
folded slices. A reduction folds in rank order, ``((x0 + x1) + x2) + ...``, so every rank computes
the same bits: those deterministic mode asks for. Their schedules (:mod:`..algorithms.lines`) are
the exact step model that the verifier checks, the simulator runs and the planner prices; this
engine runs the same steps on the lines. The first call of a shape builds its plan (views on every
line, the fingerprint); later calls of that shape allocate almost nothing.

Rounds are numbered over every call that takes the lines, in issue order (the group runs calls
strictly in that order): a call of ``numbers`` rounds takes the next ``numbers`` line numbers.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from .. import collectives, wire
from ..algorithms import Algorithm
from ..dtypes import code_of
from ..ops import kernel
from ..transport.shm.linepath import Lines
from .call import Call, Idle, reworded

SENDS = {"all_reduce": True, "reduce": True, "all_gather": True, "broadcast": False, "barrier": False}


class Plan:
    """One call shape on the lines, in one round: what each rank writes, what it reads, and how it is checked."""

    __slots__ = ("numbering", "lines", "call", "fingerprint", "header", "views", "rank", "root", "sends", "finish",
                 "ufunc")
    numbers = 1  # line numbers a run takes

    def __init__(self, engine: LinesEngine, call: Call):
        self.numbering = engine.numbering
        self.lines = lines = engine.lines
        self.call = call
        self.rank, self.root = lines.rank, call.root
        self.header, self.fingerprint = described(call)
        self.views = lines.views(call.dtype, call.count if call.collective != "barrier" else 0)
        self.sends = SENDS[call.collective] or (call.collective == "broadcast" and self.rank == call.root)
        self.finish = getattr(self, "_" + call.collective)
        self.ufunc = kernel(call.op, call.dtype)

    def run(self, buffers: dict[str, np.ndarray], seq: int, timeout: float, idle: Idle = None,
            idle_every: float = 1.0) -> None:
        """See :meth:`Planned.run <allreduce.engines.Planned.run>`."""
        numbering = self.numbering
        number = numbering.numbered = numbering.numbered + 1  # the next line number (LinesEngine.take, inlined)
        views = self.views[number & 1]
        try:
            if self.sends:
                views[self.rank][...] = buffers["data"]
            self.lines.post(number, seq, self.fingerprint, self.header)
            self.lines.wait(number, seq, self.fingerprint, time.monotonic() + timeout, idle, idle_every)
            self.finish(views, buffers)
        except BaseException as exc:
            raise reworded(exc, f"{self.call.collective} #{seq} ({self.call.algorithm})", timeout) from exc

    def _all_reduce(self, views: list[np.ndarray], buffers: dict[str, np.ndarray]) -> None:
        """The left fold over ranks in rank order, into ``data``."""
        data, ufunc = buffers["data"], self.ufunc
        ufunc(views[0], views[1], data)
        for rank in range(2, len(views)):
            ufunc(data, views[rank], data)

    def _reduce(self, views: list[np.ndarray], buffers: dict[str, np.ndarray]) -> None:
        if self.rank == self.root:
            self._all_reduce(views, buffers)

    def _broadcast(self, views: list[np.ndarray], buffers: dict[str, np.ndarray]) -> None:
        if self.rank != self.root:
            np.copyto(buffers["data"], views[self.root])

    def _all_gather(self, views: list[np.ndarray], buffers: dict[str, np.ndarray]) -> None:
        out = buffers["out"].reshape(len(views), self.call.count)
        for rank, view in enumerate(views):
            np.copyto(out[rank], view)

    def _barrier(self, views: list[np.ndarray], buffers: dict[str, np.ndarray]) -> None:
        pass


class ChunkedPlan:
    """One all-reduce (or reduce) shape on the lines in chunks of a line each, two rounds per chunk.

    Round one: every rank writes its chunk into its line, all but its own slice. Round two: each rank
    folds its own slice of the chunk over every rank's line (its own slice from its array), in rank
    order, into its other line; then every rank copies each slice from its folder's line. A rank
    reduces only its share and moves each byte once, as in a reduce-scatter followed by an
    all-gather, and the result has the left fold's bits. A run of number ``k`` uses numbers
    ``k .. k + 2 * chunks - 1``: inputs always in line ``k % 2``, folds in the other, so the lines'
    rule for reuse (see :mod:`.transport.shm.linepath`) holds unchanged.
    """

    __slots__ = ("engine", "lines", "call", "fingerprint", "header", "numbers", "ufunc", "_rounds")

    def __init__(self, engine: LinesEngine, call: Call):
        self.engine = engine
        self.lines = lines = engine.lines
        self.call = call
        self.header, self.fingerprint = described(call)
        self.ufunc = kernel(call.op, call.dtype)
        per_line = lines.capacity // call.dtype.itemsize
        bounds = [(low, min(call.count, low + per_line)) for low in range(0, call.count, per_line)]
        self.numbers = 2 * len(bounds)
        views = lines.views(call.dtype, per_line)
        keeps = call.collective == "all_reduce" or lines.rank == call.root
        self._rounds = lines.keep([[_Chunk(views[parity], views[1 - parity], lines.rank, low, high, keeps)
                                     for low, high in bounds] for parity in (0, 1)])

    def run(self, buffers: dict[str, np.ndarray], seq: int, timeout: float, idle: Idle = None,
            idle_every: float = 1.0) -> None:
        """See :meth:`Planned.run <allreduce.engines.Planned.run>`."""
        number = self.engine.take(self.numbers)
        lines, fingerprint, header, ufunc = self.lines, self.fingerprint, self.header, self.ufunc
        data = buffers["data"]
        deadline = time.monotonic() + timeout
        try:
            for chunk in self._rounds[number & 1]:
                for low, high, line in chunk.sends:
                    np.copyto(line, data[low:high])
                lines.post(number, seq, fingerprint, header)
                lines.wait(number, seq, fingerprint, deadline, idle, idle_every)
                terms, into, low, high = chunk.terms, chunk.fold, chunk.low, chunk.high
                terms[chunk.rank] = data[low:high]
                ufunc(terms[0], terms[1], into)
                for term in terms[2:]:
                    ufunc(into, term, into)
                terms[chunk.rank] = None  # no reference to the caller's array outlives the call
                lines.post(number + 1, seq, fingerprint, header)
                if chunk.keeps:
                    np.copyto(data[low:high], into)
                lines.wait(number + 1, seq, fingerprint, deadline, idle, idle_every)
                for low, high, folded in chunk.gather:
                    np.copyto(data[low:high], folded)
                number += 2
        except BaseException as exc:
            for chunk in self._rounds[number & 1]:
                chunk.terms[chunk.rank] = None  # nor of the caller's array, whichever chunk it failed in
            chunk = terms = into = folded = line = None  # a traceback kept by the group holds no view of the lines
            raise reworded(exc, f"{self.call.collective} #{seq} ({self.call.algorithm})", timeout) from exc


class _Chunk:
    """One chunk's views: the parts of the caller's array this rank writes into its line, the terms of
    the slice it folds (its own term is the caller's array, set per run) and the line it folds into;
    where this rank keeps the result, every other slice's folded line and its place in the array."""

    __slots__ = ("rank", "low", "high", "sends", "terms", "fold", "keeps", "gather")

    def __init__(self, inputs: list[np.ndarray], folds: list[np.ndarray], rank: int, start: int, stop: int,
                 keeps: bool):
        size, count = len(inputs), stop - start
        cuts = [count * part // size for part in range(size + 1)]
        mine = inputs[rank]
        self.rank, self.low, self.high = rank, start + cuts[rank], start + cuts[rank + 1]
        self.sends = [(start + low, start + high, mine[low:high])
                      for low, high in ((0, cuts[rank]), (cuts[rank + 1], count)) if high > low]
        self.terms: list[np.ndarray | None] = [line[cuts[rank]:cuts[rank + 1]] for line in inputs]
        self.fold = folds[rank][cuts[rank]:cuts[rank + 1]]
        self.keeps = keeps
        self.gather = [(start + cuts[part], start + cuts[part + 1], folds[part][cuts[part]:cuts[part + 1]])
                       for part in range(size) if part != rank] if keeps else []


def described(call: Call) -> tuple[bytes, int]:
    """The frame header a mismatch is described by, and the fingerprint ranks compare: both of ``call``."""
    header = wire.encode(wire.Header(wire.DATA, collectives.get(call.collective).code, code_of(call.dtype),
                                     int(call.op), call.root, 0, 0, call.count, call.count * call.dtype.itemsize,
                                     call.digest))
    return header, int.from_bytes(hashlib.blake2b(header, digest_size=8).digest(), "little") >> 1


class Numbering:
    """The line numbers a group's calls have taken so far (see the module docstring)."""

    __slots__ = ("numbered",)

    def __init__(self) -> None:
        self.numbered = 0


class LinesEngine:
    """Plans calls on one group's ``lines`` and numbers their rounds (see the module docstring).

    ``numbering``: what counts the line numbers taken (the compiled lines' ``Lines``, where compiled plans
    run beside this engine's; default a :class:`Numbering` of its own)."""

    def __init__(self, lines: Lines, numbering: Any = None):
        self.lines = lines
        self.numbering = numbering if numbering is not None else Numbering()

    def plan(self, entry: Algorithm, call: Call, options: dict[str, Any]) -> Plan | ChunkedPlan:
        """``call`` as a ready plan of ``entry`` (``lines`` or ``chunked_lines``); the chunk is a line."""
        return (ChunkedPlan if entry.name == "chunked_lines" else Plan)(self, call)

    def take(self, numbers: int) -> int:
        """The first of the next ``numbers`` line numbers, taken by the call that runs now."""
        numbering = self.numbering
        first = numbering.numbered + 1
        numbering.numbered += numbers
        return first

    def close(self) -> None:
        """Nothing to drop here: the lines empty every view they handed out when the transport closes."""
