"""Small collectives through the shared-memory lines: no schedule, no frames, a ready plan per call shape.

When every rank of a group is on one host, a collective of at most ``line_max`` bytes per rank
(``ALLREDUCE_SHM_LINE_MAX``) whose algorithm is left to the library takes this path
(:mod:`.transport.shm.lines`): each rank writes its contribution into its line, waits for its peers'
lines and reads them in place. A reduction folds every rank's line in rank order,
``((x0 + x1) + x2) + ...``, so every rank computes the same bits: those deterministic mode asks for.
The first call of a shape builds its :class:`Plan` (views on every line, the fingerprint); later calls
of that shape allocate nothing.

The group takes this path on facts all its ranks share (every member on this host, the call's shape,
the settings), and the path is part of the fingerprint that ranks compare, so ranks that called
differently are told apart even when one of them took the other path.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from . import collectives, wire
from .dtypes import code_of
from .executor import Call, reworded
from .ops import ReduceOp, kernel

LABEL = "lines"  # the algorithm name errors and progress reports give this path
SENDS = {"all_reduce": True, "reduce": True, "all_gather": True, "broadcast": False, "barrier": False}


class Plan:
    """One call shape on the lines: what each rank writes, what it reads, and how it is checked."""

    __slots__ = ("lines", "call", "fingerprint", "header", "views", "rank", "root", "sends", "finish", "ufunc")

    def __init__(self, lines, call: Call):
        self.lines = lines
        self.call = call  # the call as every rank must agree on it; ``seq`` is that of each run
        self.rank, self.root = lines.rank, call.root
        header = wire.Header(wire.DATA, collectives.get(call.collective).code, code_of(call.dtype), int(call.op),
                             call.root, 0, 0, call.count, call.count * call.dtype.itemsize, call.digest)
        self.header = wire.encode(header)
        self.fingerprint = int.from_bytes(hashlib.blake2b(self.header, digest_size=8).digest(), "little") >> 1
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


def plan(lines, collective: str, count: int, dtype: np.dtype, op: ReduceOp, root: int) -> Plan | None:
    """The plan for a call of this shape on ``lines``, or ``None`` where it does not take them
    (a collective the lines do not serve, or more than a line holds). Deterministic mode changes
    nothing here: the lines already fold in rank order."""
    if collective not in SENDS or count * dtype.itemsize > lines.capacity:
        return None
    digest = wire.algorithm_digest(LABEL, f"line_max={lines.capacity}")
    return Plan(lines, Call(collective, 0, LABEL, dtype, op, count, root, digest))
