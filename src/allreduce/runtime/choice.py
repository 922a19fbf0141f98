"""One group's planned calls: each call shape's plan (:mod:`..planner.plans`) bound to the engine it
names, made on the shape's first call and remembered.

A plan depends only on what every rank knows alike (the group's site, the call's shape, the settings),
never on timing. The lines algorithms run on the lines engine (the compiled one where
``ALLREDUCE_ENGINE`` allows it and it was built, :func:`lines_engine`); every other algorithm on the
schedule engine (compiled too where every link is plain TCP, :func:`schedule_engine`).
"""

from __future__ import annotations

import numpy as np

from .. import logs, native
from ..algorithms.lines import LineLimits
from ..engines import Call, Engine, LinesEngine, NativeLinesEngine, Planned, ScheduleEngine, engine_for
from ..memo import Memo
from ..ops import ReduceOp
from ..planner import determinism, plans
from ..settings import Settings
from ..topology import Topology

_log = logs.get("planner")


def lines_engine(lines, settings: Settings) -> tuple[Engine | None, str]:
    """The engine for the lines plans of a group whose transport has ``lines`` (``None``: it has none),
    and which it is and why (``"native (compiled)"``, ``"python (ALLREDUCE_ENGINE=python)"``, ...): the
    compiled lines where ``settings`` allow and the extension loaded.

    Raises:
        ImportError: ``ALLREDUCE_ENGINE=native`` and the compiled engine is missing (naming why).
    """
    module, why = native.chosen("line_plans", settings)
    if lines is None:
        return None, "none (no shared-memory lines in this group)"
    if module is None:
        return LinesEngine(lines), f"python ({why})"
    return NativeLinesEngine(lines, module), f"native ({why})"


def schedule_engine(transport, settings: Settings) -> tuple[Engine, str]:
    """The engine for the schedules of a group on ``transport``, and which it is and why: the compiled
    one where ``settings`` allow, the extension loaded and every link is a plain TCP socket
    (:func:`..engines.engine_for`), else the Python one.

    Raises:
        ImportError: ``ALLREDUCE_ENGINE=native`` and the compiled engine is missing (naming why).
    """
    module, why = native.chosen("tcp", settings)
    compiled = engine_for(transport, module)
    if compiled is not None:
        return compiled, f"native ({why}; every link plain TCP)"
    return ScheduleEngine(transport), f"python ({why if module is None else 'the links are not all plain TCP'})"


class Choice:
    """One group's planned call per call shape (see the module docstring)."""

    def __init__(self, name: str, topology: Topology, intra: str, settings: Settings, schedules: Engine,
                 lines: Engine | None, limits: LineLimits | None, world_rank: int):
        self.name, self.settings, self.world_rank = name, settings, world_rank
        self._site = plans.Site(topology, intra, settings, limits if lines is not None else None)
        self._engines: dict[plans.EngineKind, Engine] = {"schedules": schedules}  # and "lines" where it has them
        if lines is not None:
            self._engines["lines"] = lines
        self._planned: Memo = Memo()  # (collective, algorithm, count, dtype, op, root, deterministic) -> Planned

    def planned(self, collective: str, algorithm: str | None, count: int, dtype: np.dtype, op: ReduceOp,
                root: int) -> Planned:
        """The planned call of this shape, made on its first call (the planner reads the cost profile,
        too slow to repeat per call)."""
        key = (collective, algorithm, count, dtype, op, root, determinism.enabled(self.settings))
        planned: Planned | None = self._planned.get(key)
        if planned is None:
            planned = self._planned.remember(key, self._plan(*key))
        return planned

    def _plan(self, collective: str, algorithm: str | None, count: int, dtype: np.dtype, op: ReduceOp,
              root: int, deterministic: bool) -> Planned:
        chosen = plans.plan(self._site, collective, algorithm, count, dtype, op, deterministic)
        _log.info("group %s: %s of %d bytes (%s) runs %s", self.name, collective, count * dtype.itemsize, dtype,
                  chosen.algorithm)
        call = Call(collective, chosen.algorithm, dtype, op, count, root, chosen.digest)
        planned = self._engines[chosen.engine].plan(chosen.entry, call, dict(chosen.options))
        if logs.DETAIL:  # ALLREDUCE_DEBUG=DETAIL: log every run (when off, this costs nothing per call)
            planned = logs.TimedPlanned(planned, self.world_rank)
        return planned

    def algorithm_for(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype,
                      in_rank_order: bool = False) -> str:
        """The algorithm a call of ``nbytes`` runs (:func:`..planner.plans.algorithm_for`)."""
        return plans.algorithm_for(self._site, collective, algorithm, nbytes, dtype, in_rank_order)

    def close(self) -> None:
        """Forget every planned call (they hold views of the transport)."""
        self._planned.clear()
        for engine in self._engines.values():
            engine.close()
