"""Engines: what runs a planned call on a group's transport, the one interface below the group.

A *planned call* is a :class:`Call` (the shape every rank agrees on) bound to what runs it, ready
before its first run and reused for every later call of that shape. The group calls
``planned.run(buffers, seq, timeout, idle, idle_every)``; a plan that is also :class:`Resumable` (the
compiled lines') makes the group's compiled shortcut of its shape and goes on with a run that shortcut
began. These engines make planned calls:

- :class:`ScheduleEngine` (:mod:`.schedules`) runs a registered algorithm's schedule step by step over
  any transport;
- :class:`LinesEngine` (:mod:`.line_plans`) runs the lines algorithms (``lines``, ``chunked_lines``) on the
  shared-memory lines of a group whose ranks share one host;
- :class:`NativeLinesEngine` (:mod:`.native_line_plans`) runs the same plans in C, one call per run with the
  GIL released (``allreduce.native._line_plans``), where the extension was built;
- :class:`NativeTcpEngine` (:mod:`.native_tcp`) runs the schedules of a group whose every link is a
  plain TCP socket in C, one call per run with the GIL released (``allreduce.native._tcp``).

Which engine plans a call follows from the algorithm the plan chose (an entry that runs on the lines,
where the transport has them), never from probing objects; whether the lines or the schedules run in
C follows from ``ALLREDUCE_ENGINE``, the build and (for schedules) the links. Every engine implements the same two
methods: ``plan(entry, call, options)`` and ``close()``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable

import numpy as np

from ..algorithms import Algorithm
from .call import Call, reworded
from .line_plans import LinesEngine
from .native_line_plans import NativeLinesEngine
from .native_tcp import NativeTcpEngine, engine_for
from .schedules import ScheduleEngine


class Planned(Protocol):
    """A call shape ready to run (see the module docstring)."""

    call: Call

    def run(self, buffers: dict[str, np.ndarray], seq: int, timeout: float,
            idle: Callable[[], None] | None = None, idle_every: float = 1.0) -> None:
        """Run the call as group call number ``seq`` on the flat arrays in ``buffers`` within ``timeout``
        seconds, calling ``idle()`` every ``idle_every`` seconds without progress (it may raise).

        Raises the transport's errors re-worded to name the collective (and the step), and
        :class:`~allreduce.errors.Interrupted` for any other exception (see :func:`reworded`).
        """


class CompiledShortcut(Protocol):
    """``shortcut(array) -> bool``: a blocking call of a plan's shape claimed, numbered and run in one
    compiled call (see ``native/_line_plans.c``'s Shortcut)."""

    def __call__(self, data: np.ndarray | None, /) -> bool:
        """Run the call on ``data`` (``None``: a barrier): ``False``, nothing done, where the general path must."""

    def retire(self) -> None:
        """Every later call answers ``False`` (its group dropped it)."""


@runtime_checkable
class Resumable(Planned, Protocol):
    """A planned call whose runs a compiled shortcut can begin, and which goes on with them."""

    def resume(self, outcome: int | BaseException, buffers: dict[str, np.ndarray], seq: int, timeout: float,
               idle: Callable[[], None] | None = None, idle_every: float = 1.0) -> None:
        """Go on with run ``seq`` from what its compiled run returned or raised, as :meth:`Planned.run` would."""

    def shortcut(self, state: Any, timeout: float,
                 resume: Callable[[int, np.ndarray | None, Any], None]) -> CompiledShortcut:
        """The compiled shortcut of this shape on the group's call ``state`` (:mod:`.callstate`, the
        compiled one), which hands any ending but the plain one to ``resume(seq, data, outcome)``."""


class Engine(Protocol):
    """Makes planned calls for one group's transport."""

    def plan(self, entry: Algorithm, call: Call, options: dict[str, Any]) -> Planned:
        """The planned call for ``call``, run by ``entry``'s algorithm with ``options`` (from the group)."""

    def close(self) -> None:
        """Drop what the planned calls hold of the transport (views of shared memory)."""


__all__ = ["Call", "CompiledShortcut", "Engine", "LinesEngine", "NativeLinesEngine", "NativeTcpEngine", "Planned",
           "Resumable", "ScheduleEngine", "engine_for", "reworded"]
