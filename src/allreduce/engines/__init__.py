"""Engines: what runs a planned call on a group's transport, the one interface below the group.

A *planned call* is a :class:`Call` (the shape every rank agrees on) bound to what runs it, ready
before its first run and reused for every later call of that shape. The group only ever calls
``planned.run(buffers, seq, timeout, idle, idle_every)``. Two engines make planned calls today:

- :class:`ScheduleEngine` (:mod:`.schedules`) runs a registered algorithm's schedule step by step over
  any transport;
- :class:`LinesEngine` (:mod:`.lines`) runs the lines algorithms (``lines``, ``chunked_lines``) on the
  shared-memory lines of a group whose ranks share one host;
- :class:`NativeLinesEngine` (:mod:`.native_lines`) runs the same plans in C, one call per run with the
  GIL released (``allreduce.native._lines``), where the extension was built;
- :class:`NativeTcpEngine` (:mod:`.native_tcp`) runs the schedules of a group whose every link is a
  plain TCP socket in C, one call per run with the GIL released (``allreduce.native._tcp``).

Which engine plans a call follows from the algorithm the plan chose (an entry that runs on the lines,
where the transport has them), never from probing objects; whether the lines or the schedules run in
C follows from ``ALLREDUCE_ENGINE``, the build and (for schedules) the links. Every engine implements the same two methods:
``plan(entry, call, options)`` and ``close()``.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ..algorithms import Algorithm
from .call import Call, reworded
from .lines import LinesEngine
from .native_lines import NativeLinesEngine
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


class Engine(Protocol):
    """Makes planned calls for one group's transport."""

    def plan(self, entry: Algorithm, call: Call, options: dict) -> Planned:
        """The planned call for ``call``, run by ``entry``'s algorithm with ``options`` (from the group)."""

    def close(self) -> None:
        """Drop what the planned calls hold of the transport (views of shared memory)."""


__all__ = ["Call", "Engine", "LinesEngine", "NativeLinesEngine", "NativeTcpEngine", "Planned", "ScheduleEngine",
           "engine_for", "reworded"]
