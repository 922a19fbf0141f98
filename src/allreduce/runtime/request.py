"""The call record: one collective as the caller issues it to a group."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from ..ops import ReduceOp


@dataclass(slots=True)
class Request:
    """What to run, on which buffers, and what follows it (made on every call: slots, no checks, cheap).

    Example: ``Request("all_reduce", {"data": x}, x.size, x.dtype, ReduceOp.MAX)``.
    """

    collective: str  # a name in allreduce.collectives
    buffers: dict[str, np.ndarray]  # flat arrays by the schedule's names: "data", "out"
    count: int  # the collective's count, as its schedules take it (see algorithms/schedule.py)
    dtype: np.dtype
    op: ReduceOp = ReduceOp.SUM
    root: int = 0  # the root rank of a rooted collective
    algorithm: str | None = None  # a registered name; None or "auto": the planner's choice
    after: Callable[[], None] | None = None  # runs once the collective is done: copy-outs, AVG's division
