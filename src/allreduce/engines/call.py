"""The call as every rank must agree on it, and the error a call raises when something escapes it."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from .. import collectives, wire
from ..dtypes import code_of
from ..errors import AllreduceError, CommTimeout, Interrupted
from ..ops import ReduceOp

Idle = Callable[[], None] | None  # what a run calls every idle_every seconds without progress (it may raise)


@dataclass(frozen=True)
class Call:
    """One collective's shape as every rank must agree on it: what its fingerprint (frame headers, lines,
    heartbeats) is made of. The group's sequence number is not part of it: each run is given its own."""

    collective: str  # a name in allreduce.collectives
    algorithm: str  # the registered algorithm that runs it
    dtype: np.dtype
    op: ReduceOp
    count: int  # the collective's count, as the schedule function received it
    root: int = 0  # root rank (0 where the collective has none)
    digest: int = 0  # wire.algorithm_digest of the algorithm and options: ranks whose schedules differ disagree here

    def headers(self, seq: int) -> Callable[[int, int], wire.Header]:
        """A function ``(step, nbytes) -> Header`` for the frames of run ``seq`` of this call."""
        kind, collective = wire.DATA, collectives.get(self.collective).code
        dtype, op, root, count, make = code_of(self.dtype), int(self.op), self.root, self.count, wire.Header
        seq, digest = seq % wire.SEQ_MODULUS, self.digest

        def header(step: int, nbytes: int) -> wire.Header:
            return make(kind, collective, dtype, op, root, step, seq, count, nbytes, digest)

        return header


def reworded(exc: BaseException, where: str, timeout: float) -> AllreduceError:
    """The error a collective raises when ``exc`` escapes it at ``where``: :class:`Interrupted` for the
    caller's own exception (``KeyboardInterrupt``, a signal handler's: the peers are left mid-step, so the
    group must break), else the same kind of error with the collective and step in front of the
    transport's words."""
    if not isinstance(exc, AllreduceError):
        return Interrupted(f"{where} was interrupted by {type(exc).__name__}")
    if isinstance(exc, CommTimeout):
        where += f" timed out after {timeout:g}s"
    new = type(exc)(f"{where} {exc}" if isinstance(exc, CommTimeout) else f"{where}: {exc}")
    new.peer = getattr(exc, "peer", None)
    return new
