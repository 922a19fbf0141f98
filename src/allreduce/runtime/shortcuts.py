"""A group's shortcuts: blocking calls of a shape the group ran before, claimed and run in one call.

Once a blocking automatic call of a shape has taken the general path (checked, planned, run), the
group remembers a *shortcut* for its shape: ``run(array) -> bool`` claims the idle group, numbers the
call and runs it on the caller's one array (``None``: a barrier), with the general path's guarantees,
or answers ``False`` with nothing done where the general path must take the call (the group busy,
broken or destroyed, a Work callback, memory it may not write in place). ``calls.py`` looks a call up
by its :class:`Shape` before anything else; a plan of the compiled lines (:class:`~..engines.Resumable`)
makes its shortcut in C, which compiled callers (the torch backend's shim) keep and call with no
Python in between (:meth:`Shortcuts.compiled`).

A shortcut is retired (it answers ``False`` from then on) when its shape is planned anew, when this
rank tells its peers of a refusal (the general path must say the next call began), and when the
determinism mode switches (its plan may be the other mode's).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Hashable

import numpy as np

from ..engines import Planned, Resumable
from ..engines.callstate import CallStateLike
from ..ops import ReduceOp
from ..planner import determinism
from .queue import WorkQueue
from .request import Request

Key = tuple[Hashable, ...]  # a shape's key: made by Shape's constructors only


class Shape:
    """The key of a call's shape among a group's shortcuts, one constructor per collective that has one
    (plain tuples: one is built on every call)."""

    @staticmethod
    def all_reduce(dtype: np.dtype, count: int, op: ReduceOp) -> Key:
        return ("all_reduce", dtype, count, op)

    @staticmethod
    def broadcast(dtype: np.dtype, count: int, root: int) -> Key:
        return ("broadcast", dtype, count, root)

    @staticmethod
    def barrier() -> Key:
        return _BARRIER

    @staticmethod
    def of(request: Request) -> Key | None:
        """The key of ``request``'s shape, or ``None`` for a call that has no shortcut: only automatic
        calls of these collectives whose buffers are the caller's one array (or none) do, with nothing
        after them but an AVG all-reduce's division, which the shortcut's caller makes."""
        collective = request.collective
        averaged = collective == "all_reduce" and request.op is ReduceOp.AVG
        if request.algorithm is not None or (request.after is not None and not averaged):
            return None
        if collective == "all_reduce":
            return Shape.all_reduce(request.dtype, request.count, request.op)
        if collective == "broadcast":
            return Shape.broadcast(request.dtype, request.count, request.root)
        if collective == "barrier":
            return _BARRIER
        return None


_BARRIER: Key = ("barrier",)


@dataclass(frozen=True, slots=True)
class Shortcut:
    """A remembered shortcut: ``run(array) -> bool`` for calls of ``planned``'s shape."""

    run: Callable[[np.ndarray | None], bool]
    planned: Planned
    retire: Callable[[], None] | None  # makes a compiled ``run`` answer False from now on (None: a Python one)
    kept: bool  # compiled callers may keep ``run`` (compiled, and nothing to do after it: no AVG division)


def _buffers(data: np.ndarray | None) -> dict[str, np.ndarray]:
    """A shortcut's buffers: the one array, or none (a barrier)."""
    return {} if data is None else {"data": data}


class Shortcuts(dict[Key, Shortcut]):
    """One group's shortcuts by :class:`Shape` (see the module docstring); ``get`` is the lookup."""

    def __init__(self, calls: CallStateLike, lock: threading.RLock, queue: WorkQueue, timeout: float):
        super().__init__()
        self._calls, self._lock, self._queue, self._timeout = calls, lock, queue, timeout

    def remember(self, key: Key, planned: Planned, epoch: int) -> None:
        """Keep the shortcut of ``planned`` under ``key`` (with the lock held), unless the determinism mode
        switched since ``epoch`` (read before the call was planned: the plan may be the other mode's)."""
        known = self.get(key)
        if (known is None or known.planned is not planned) and epoch == determinism.epoch:
            if known is not None and known.retire is not None:
                known.retire()
            self[key] = self._make(key, planned)

    def compiled(self, key: Key) -> Callable[[np.ndarray | None], bool] | None:
        """The compiled shortcut of ``key``'s shape (``_line_plans.c``'s Shortcut) where the group keeps one,
        for compiled callers that keep it (the torch backend's shim calls it through ``_line_plans``'
        ``_C_API``); else ``None``. It answers ``False`` once retired, so the caller goes the general
        way and asks again."""
        known = self.get(key)
        return known.run if known is not None and known.kept else None

    def retire_all(self) -> None:
        """Retire and forget every shortcut (safe from any thread: the next call of each shape takes the
        general path)."""
        for known in list(self.values()):
            if known.retire is not None:
                known.retire()
        self.clear()

    def _make(self, key: Key, planned: Planned) -> Shortcut:
        """A plan of the compiled lines gets its shortcut in C (:meth:`.engines.Resumable.shortcut`), which
        claims, numbers and runs the call in one call and leaves any ending but the plain one to
        :meth:`.queue.WorkQueue.run_inline`; any other plan, one in Python with the same guarantees."""
        queue = self._queue
        if isinstance(planned, Resumable):
            def resume(seq: int, data: np.ndarray | None, outcome: Any) -> None:
                queue.run_inline(seq, planned, _buffers(data), None, outcome)

            run = planned.shortcut(self._calls, self._timeout, resume)
            return Shortcut(run, planned, run.retire, key[-1] is not ReduceOp.AVG)
        calls, lock = self._calls, self._lock

        def run_planned(data: np.ndarray | None) -> bool:
            if data is not None and not (data.flags.c_contiguous and data.flags.writeable):
                return False
            if not calls.usable:
                return False
            with lock:
                seq = calls.idle_claim(threading.get_ident())
            if not seq:
                return False
            queue.run_inline(seq, planned, _buffers(data), None)
            return True

        return Shortcut(run_planned, planned, None, False)
