"""The algorithm choice: which registered algorithm runs a call shape, on which engine, planned once.

The planner picks by predicted time (:mod:`..planner`), except that an automatic all-reduce over
several hosts of several ranks each is hierarchical (inside hosts, then across them, then inside
again), and that where every member shares this host the lines take what they serve (the planner's
rule, given the lines' limits). A choice depends only on what every rank knows alike (the group, the
call's shape, the settings), never on timing. The lines algorithms run on the lines engine (the
compiled one where ``ALLREDUCE_ENGINE`` allows it and it was built, :func:`lines_engine`); every other
algorithm on the schedule engine (compiled too where every link is plain TCP, :func:`schedule_engine`).

Every registered algorithm is digested once per group with the options the group supplies
(:func:`digests`); the digest is part of the fingerprint ranks compare, so ranks that would run
different schedules (or one the lines, another a schedule) are told apart.
"""

from __future__ import annotations

import numpy as np

from .. import algorithms, collectives, logs, native, planner, wire
from ..engines import Call, Engine, LinesEngine, NativeLinesEngine, Planned, ScheduleEngine, engine_for
from ..memo import Memo
from ..ops import ReduceOp
from ..algorithms.lines import LineLimits
from ..planner import determinism
from ..settings import Settings
from ..topology import Topology

_log = logs.get("planner")


def digests(supplies: dict) -> dict[algorithms.Algorithm, tuple[dict, int]]:
    """Every registry entry's ``(options, digest)`` in a group that supplies ``supplies``.

    ``options`` are what the group passes to its schedule (the entry's ``needs``); ``digest`` is the
    :func:`wire.algorithm_digest` of its name, its own options and those. Every entry is digested, not
    only those this rank runs, so that a mismatch names the algorithm the peer ran.
    """
    prepared = {}
    for entry in algorithms.ALGORITHMS:
        options = {need: supplies[need] for need in entry.needs}
        label = entry.name + (f"({', '.join(f'{k}={v}' for k, v in entry.options.items())})" if entry.options else "")
        prepared[entry] = options, wire.algorithm_digest(label, repr(sorted(options.items())))
    return prepared


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
    """One group's algorithm per call shape and its planned calls (see the module docstring)."""

    def __init__(self, size: int, name: str, topology: Topology, intra: str, settings: Settings,
                 schedules: Engine, lines: Engine | None, limits: LineLimits | None, world_rank: int):
        self.size, self.name, self.world_rank = size, name, world_rank
        self.topology, self.intra, self.settings = topology, intra, settings
        hosts = topology.hosts
        self._hierarchical = len(hosts) > 1 and topology.uniform and len(hosts[0]) > 1
        self._digests = digests({"hosts": hosts})
        self._schedules, self._lines = schedules, lines
        self._limits = limits if lines is not None else None
        self._names: Memo = Memo()  # (collective, algorithm, nbytes, dtype, in rank order) -> name
        self._planned: Memo = Memo()  # (collective, algorithm, count, dtype, op, root, deterministic) -> Planned

    def planned(self, collective: str, algorithm: str | None, count: int, dtype: np.dtype, op: ReduceOp,
                root: int) -> Planned:
        """The planned call of this shape, made on its first call."""
        key = (collective, algorithm, count, dtype, op, root, determinism.enabled(self.settings))
        planned = self._planned.get(key)
        if planned is None:
            planned = self._planned.remember(key, self._plan(collective, algorithm, count, dtype, op, root))
        return planned

    def _plan(self, collective: str, algorithm: str | None, count: int, dtype: np.dtype, op: ReduceOp,
              root: int) -> Planned:
        ordered = collectives.get(collective).reduces and determinism.required(self.settings, op, dtype)
        name = self.algorithm_for(collective, algorithm, count * dtype.itemsize, dtype, ordered)
        entry = algorithms.get(collective, name)
        options, digest = self._digests[entry]
        call = Call(collective, name, dtype, op, count, root, digest)
        engine = self._lines if entry.medium == "lines" and self._lines is not None else self._schedules
        planned = engine.plan(entry, call, options)
        if logs.DETAIL:  # ALLREDUCE_DEBUG=DETAIL: log every run (when off, this costs nothing per call)
            planned = logs.TimedPlanned(planned, self.world_rank)
        return planned

    def algorithm_for(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype,
                      in_rank_order: bool = False) -> str:
        """The algorithm a call of ``nbytes`` runs (see the module docstring). With ``in_rank_order``
        (deterministic mode), only an algorithm that reduces in rank order.

        Remembered per call shape: the planner reads the cost profile, too slow to repeat per call.
        """
        key = (collective, algorithm, nbytes, dtype, in_rank_order)
        name = self._names.get(key)
        if name is None:
            name = self._names.remember(key, self._choose(collective, algorithm, nbytes, dtype, in_rank_order))
            _log.info("group %s: %s of %d bytes (%s) runs %s", self.name, collective, nbytes, dtype, name)
        return name

    def _choose(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype,
                in_rank_order: bool) -> str:
        if (self._hierarchical and collective == "all_reduce" and algorithm in (None, "auto")
                and self.settings.algorithm == "auto" and not in_rank_order):
            return "hierarchical"
        return planner.choose(collective, algorithm, nbytes, self.size, hosts=len(self.topology.hosts), dtype=dtype,
                              transport=self.intra, forced=self.settings.algorithm, profile=self.settings.profile,
                              cache_home=self.settings.cache_home,
                              in_rank_order=in_rank_order, lines=self._limits)

    def close(self) -> None:
        """Forget every planned call (they hold views of the transport)."""
        self._planned.clear()
        self._schedules.close()
        if self._lines is not None:
            self._lines.close()
