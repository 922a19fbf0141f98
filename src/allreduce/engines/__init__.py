"""Engines: what runs a planned call on a group's transport, the one interface below the group.

A *planned call* is a :class:`Call` (the shape every rank agrees on) bound to what runs it, ready
before its first run and reused for every later call of that shape. The group only ever calls
``planned.run(buffers, seq, timeout, idle, idle_every)``. Two engines make planned calls today:

- :class:`ScheduleEngine` (:mod:`.schedules`) runs a registered algorithm's schedule step by step over
  any transport;
- :class:`LinesEngine` (:mod:`.lines`) runs the lines algorithms (``lines``, ``chunked_lines``) on the
  shared-memory lines of a group whose ranks share one host.

Which engine plans a call follows from the algorithm the plan chose (an entry that runs on the lines,
where the transport has them), never from probing objects. A compiled engine implements the same two
methods: ``plan(entry, call, options)`` and ``close()``; :class:`NativeTcpEngine` (:mod:`.native_tcp`)
runs the schedules of a group on plain TCP links that way (:func:`schedule_engine` picks it).
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from .. import native
from ..algorithms import Algorithm
from ..settings import Settings
from .call import Call, reworded
from .lines import LinesEngine
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


def schedule_engine(transport, settings: Settings) -> Engine:
    """The engine that runs a group's schedules on ``transport``: the compiled one where ``settings``
    allow it (``ALLREDUCE_ENGINE``) and every link is plain TCP, else the Python one.

    Raises:
        ImportError: ``ALLREDUCE_ENGINE=native`` and the compiled engine was not built.
    """
    module, _ = native.chosen("tcp", settings)
    return engine_for(transport, module) or ScheduleEngine(transport)


__all__ = ["Call", "Engine", "LinesEngine", "NativeTcpEngine", "Planned", "ScheduleEngine", "reworded",
           "schedule_engine"]
