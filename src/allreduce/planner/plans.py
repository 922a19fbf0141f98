"""The plan of a call shape: which registered algorithm runs it, with which options and digest, on
which engine.

:func:`plan` is one pure function of the call's shape, the group's :class:`Site` (its hosts, the
transport between ranks of one host, what its shared-memory lines take, the settings that steer the
choice) and the cost profile those settings name: never of timing, so every rank of a group plans a
shape alike. The group remembers each shape's plan, bound to its engine (``runtime/choice.py``).

The algorithm (:func:`algorithm_for`): an automatic all-reduce over several hosts of several ranks
each, alike, is hierarchical (inside hosts, then across them, then inside again); anything else is
the planner's choice (:func:`..choose`: by rule on the lines, else by predicted time). The engine: an
algorithm of the lines runs on the lines engine where the group has lines; every other on the
schedules engine.

Every registered algorithm is digested once per site (:func:`digests`); the digest is part of the
fingerprint ranks compare, so ranks that would run different schedules (or one the lines, another a
schedule) are told apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .. import algorithms, collectives, wire
from ..algorithms import Algorithm
from ..algorithms.lines import LineLimits
from ..ops import ReduceOp
from ..settings import Settings
from ..topology import Topology
from . import choose, determinism

EngineKind = Literal["lines", "schedules"]  # the engines a plan names


def digests(supplies: dict[str, Any]) -> dict[Algorithm, tuple[dict[str, Any], int]]:
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


@dataclass(frozen=True, eq=False)
class Site:
    """What a group's plans depend on besides the call, alike on every rank (see the module docstring).

    Its digests are made when it is: a group's first mismatch can name the peer's algorithm.
    """

    topology: Topology
    intra: str  # the transport between ranks of one host: "tcp" or "shm"
    settings: Settings  # the forced algorithm, the cost profile's file
    lines: LineLimits | None  # what the group's lines take; None: it has none to run them on
    digests: Mapping[Algorithm, tuple[dict[str, Any], int]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digests", digests({"hosts": self.topology.hosts}))

    @property
    def hierarchical(self) -> bool:
        """Whether an automatic all-reduce is hierarchical: several hosts of several ranks each, alike."""
        hosts = self.topology.hosts
        return len(hosts) > 1 and self.topology.uniform and len(hosts[0]) > 1


@dataclass(frozen=True)
class ShapePlan:
    """A call shape's plan: the entry that runs it, the options the group supplies, their digest, and
    the engine that runs it."""

    entry: Algorithm
    options: Mapping[str, Any]
    digest: int  # wire.algorithm_digest of the entry and its options
    engine: EngineKind

    @property
    def algorithm(self) -> str:
        """The registered algorithm's name."""
        return self.entry.name


def plan(site: Site, collective: str, requested: str | None, count: int, dtype: np.dtype, op: ReduceOp,
         deterministic: bool) -> ShapePlan:
    """The plan of a call of ``count`` elements of ``dtype`` (``requested``: an algorithm name, ``"auto"``
    or ``None``), where ``deterministic`` says whether deterministic mode is on.

    Raises:
        ValueError: an unknown algorithm name (listing the choices), or an unreadable cost profile.
    """
    in_rank_order = deterministic and collectives.get(collective).reduces and determinism.order_matters(op, dtype)
    entry = algorithms.get(collective, algorithm_for(site, collective, requested, count * dtype.itemsize, dtype,
                                                     in_rank_order))
    options, digest = site.digests[entry]
    return ShapePlan(entry, options, digest, "lines" if entry.medium == "lines" and site.lines is not None
                     else "schedules")


def algorithm_for(site: Site, collective: str, requested: str | None, nbytes: int, dtype: np.dtype,
                  in_rank_order: bool = False) -> str:
    """The algorithm a call of ``nbytes`` runs (see the module docstring). With ``in_rank_order``
    (deterministic mode), only an algorithm that reduces in rank order."""
    settings = site.settings
    if (site.hierarchical and collective == "all_reduce" and requested in (None, "auto")
            and settings.algorithm == "auto" and not in_rank_order):
        return "hierarchical"
    return choose(collective, requested, nbytes, site.topology.size, hosts=len(site.topology.hosts), dtype=dtype,
                  transport=site.intra, forced=settings.algorithm, profile=settings.profile,
                  cache_home=settings.cache_home, in_rank_order=in_rank_order, lines=site.lines)
