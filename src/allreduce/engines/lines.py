"""Small and medium collectives through the shared-memory lines: no schedule, no frames, a ready plan per
call shape.

When every rank of a group is on one host and the call's algorithm is left to the library, a
collective of at most ``line_max`` bytes per rank (``ALLREDUCE_SHM_LINE_MAX``) takes the lines in one
round (:mod:`.transport.shm.lines`): each rank writes its contribution into its line, waits for its
peers' lines and reads them in place. An all-reduce or reduce of up to ``chunked_max`` bytes
(``ALLREDUCE_SHM_CHUNKED_MAX``) takes them in chunks of a line (:class:`ChunkedPlan`): each rank
folds its own slice of every chunk, then all copy the folded slices. A reduction folds in rank
order, ``((x0 + x1) + x2) + ...``, so every rank computes the same bits: those deterministic mode
asks for. The first call of a shape builds its plan (views on every line, the fingerprint); later
calls of that shape allocate almost nothing.

The group takes this path on facts all its ranks share (every member on this host, the call's shape,
the settings), and the path is part of the fingerprint that ranks compare, so ranks that called
differently are told apart even when one of them took the other path.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from .. import collectives, wire
from ..dtypes import code_of
from .schedules import Call, reworded
from ..ops import ReduceOp, kernel

LABEL = "lines"  # the algorithm name errors and progress reports give this path
SENDS = {"all_reduce": True, "reduce": True, "all_gather": True, "broadcast": False, "barrier": False}


class Plan:
    """One call shape on the lines, in one round: what each rank writes, what it reads, and how it is checked."""

    __slots__ = ("lines", "call", "fingerprint", "header", "views", "rank", "root", "sends", "finish", "ufunc")
    numbers = 1  # line numbers a run takes

    def __init__(self, lines, call: Call):
        self.lines = lines
        self.call = call  # the call as every rank must agree on it; ``seq`` is that of each run
        self.rank, self.root = lines.rank, call.root
        self.header, self.fingerprint = _described(call)
        self.views = lines.views(call.dtype, call.count if call.collective != "barrier" else 0)
        self.sends = SENDS[call.collective] or (call.collective == "broadcast" and self.rank == call.root)
        self.finish = getattr(self, "_" + call.collective)
        self.ufunc = kernel(call.op)

    def run(self, buffers: dict[str, np.ndarray], number: int, seq: int, timeout: float, idle=None,
            idle_every: float = 1.0) -> None:
        """Run call ``number`` on the lines (group sequence number ``seq``) on ``buffers`` within
        ``timeout`` seconds, calling ``idle()`` every ``idle_every`` seconds without progress.

        Raises the lines' errors re-worded to name the collective, and :class:`Interrupted` for any
        other exception (see :mod:`.executor`).
        """
        views = self.views[number & 1]
        try:
            if self.sends:
                views[self.rank][...] = buffers["data"]
            self.lines.post(number, seq, self.fingerprint, self.header)
            self.lines.wait(number, seq, self.fingerprint, time.monotonic() + timeout, idle, idle_every)
            self.finish(views, buffers)
        except BaseException as exc:
            raise reworded(exc, f"{self.call.collective} #{seq} ({LABEL})", timeout) from exc

    def _all_reduce(self, views: list[np.ndarray], buffers: dict[str, np.ndarray]) -> None:
        """The left fold over ranks in rank order, into ``data``."""
        data, ufunc = buffers["data"], self.ufunc
        ufunc(views[0], views[1], data)
        for rank in range(2, len(views)):
            ufunc(data, views[rank], data)

    def _reduce(self, views, buffers) -> None:
        if self.rank == self.root:
            self._all_reduce(views, buffers)

    def _broadcast(self, views, buffers) -> None:
        if self.rank != self.root:
            np.copyto(buffers["data"], views[self.root])

    def _all_gather(self, views, buffers) -> None:
        out = buffers["out"].reshape(len(views), self.call.count)
        for rank, view in enumerate(views):
            np.copyto(out[rank], view)

    def _barrier(self, views, buffers) -> None:
        pass


class ChunkedPlan:
    """One all-reduce (or reduce) shape on the lines in chunks of a line each, two rounds per chunk.

    Round one: every rank writes its chunk into its line, all but its own slice. Round two: each rank
    folds its own slice of the chunk over every rank's line (its own slice from its array), in rank
    order, into its other line; then every rank copies each slice from its folder's line. A rank
    reduces only its share and moves each byte once, as in a reduce-scatter followed by an
    all-gather, and the result has the left fold's bits. A run of number ``k`` uses numbers
    ``k .. k + 2 * chunks - 1``: inputs always in line ``k % 2``, folds in the other, so the lines'
    rule for reuse (see :mod:`.transport.shm.lines`) holds unchanged.
    """

    __slots__ = ("lines", "call", "fingerprint", "header", "numbers", "ufunc", "_rounds")

    def __init__(self, lines, call: Call):
        self.lines = lines
        self.call = call
        self.header, self.fingerprint = _described(call)
        self.ufunc = kernel(call.op)
        per_line = lines.capacity // call.dtype.itemsize
        bounds = [(low, min(call.count, low + per_line)) for low in range(0, call.count, per_line)]
        self.numbers = 2 * len(bounds)
        views = lines.views(call.dtype, per_line)
        keeps = call.collective == "all_reduce" or lines.rank == call.root
        self._rounds = lines.keep([[_Chunk(views[parity], views[1 - parity], lines.rank, low, high, keeps)
                                     for low, high in bounds] for parity in (0, 1)])

    def run(self, buffers: dict[str, np.ndarray], number: int, seq: int, timeout: float, idle=None,
            idle_every: float = 1.0) -> None:
        """As :meth:`Plan.run`, for the line numbers from ``number`` on."""
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
            raise reworded(exc, f"{self.call.collective} #{seq} ({LABEL})", timeout) from exc


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


def _described(call: Call) -> tuple[bytes, int]:
    """The frame header a mismatch is described by, and the fingerprint ranks compare: both of ``call``."""
    header = wire.encode(wire.Header(wire.DATA, collectives.get(call.collective).code, code_of(call.dtype),
                                     int(call.op), call.root, 0, 0, call.count, call.count * call.dtype.itemsize,
                                     call.digest))
    return header, int.from_bytes(hashlib.blake2b(header, digest_size=8).digest(), "little") >> 1


def plan(lines, collective: str, count: int, dtype: np.dtype, op: ReduceOp, root: int) -> Plan | ChunkedPlan | None:
    """The plan for a call of this shape on ``lines``, or ``None`` where it does not take them (a
    collective the lines do not serve, or more than they take). Up to ``line_max`` bytes per rank a
    call takes one round; an all-reduce or reduce of up to ``chunked_max`` bytes takes them in chunks.
    Deterministic mode changes nothing here: the lines always fold in rank order."""
    nbytes = count * dtype.itemsize
    terms = f"line_max={lines.at_once},chunked_max={lines.chunked_max},line_chunk={lines.capacity}"
    call = Call(collective, 0, LABEL, dtype, op, count, root, wire.algorithm_digest(LABEL, terms))
    if collective in SENDS and lines.at_once and nbytes <= lines.at_once:
        return Plan(lines, call)
    if collective in ("all_reduce", "reduce") and nbytes <= lines.chunked_max and dtype.itemsize <= lines.capacity:
        return ChunkedPlan(lines, call)
    return None
