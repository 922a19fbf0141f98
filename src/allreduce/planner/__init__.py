"""Chooses the algorithm for a collective when the caller says ``"auto"``.

"auto" takes the registered algorithm with the smallest predicted time on this machine's cost profile
(:mod:`allreduce.planner.costmodel`: measured by ``allreduce tune``, else built-in defaults) for the
message size, world size and number of hosts.
Algorithms without a cost formula are not candidates; a collective with none keeps its default.
A forced algorithm (``ALLREDUCE_ALGO``, passed in as ``forced``) overrides the choice wherever the
named algorithm exists for the collective. In deterministic mode (``in_rank_order``, see
:mod:`.determinism`) the candidates are only the algorithms that reduce in rank order, and a named or
forced algorithm that does not is replaced by the fastest one that does.

The shared-memory lines (``algorithms/lines.py``) are chosen by rule, not price, where the group's
transport has them (``lines``, a :class:`LineLimits`) and the choice is auto: a one-round collective of
at most ``at_once`` bytes per rank takes them in one round, a larger all-reduce or reduce of at most
``chunked_max`` bytes in chunks; their entries reduce in rank order, so deterministic mode keeps the
rule. Without ``lines`` auto never picks them (a named one still runs, on the executor).
``allreduce plan`` prints the predictions behind a choice. A group plans each call shape whole (its
algorithm by these rules, its options and digest, the engine that runs it) with :mod:`.plans`.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import algorithms, collectives
from ..dtypes import resolve
from ..algorithms import lines as line_schedules
from ..algorithms.lines import LineLimits
from . import costmodel

__all__ = ["LineLimits", "choose", "on_lines", "options"]


def choose(collective: str, requested: str | None, nbytes: int, size: int, *, hosts: int = 1,
           dtype=None, transport: str = "tcp", forced: str = "auto", profile: str = "", cache_home: str = "",
           in_rank_order: bool = False, lines: LineLimits | None = None) -> str:
    """The registered algorithm to run.

    Args:
        collective: a registry collective.
        requested: an algorithm name, ``"auto"`` or ``None`` (auto).
        nbytes: ``count * itemsize`` as the schedule counts it (per rank's block for all_gather,
            reduce_scatter, all_to_all, gather and scatter).
        size: ranks in the group.
        hosts: hosts the group spans.
        dtype: element type (its reduction speed matters), default float32.
        transport: the transport between ranks of one host.
        forced: the job's forced algorithm (``ALLREDUCE_ALGO``), used where ``collective`` has it.
        profile: the cost profile file (default: the one in ``cache_home``, else built-in defaults).
        cache_home: the user's cache directory (``XDG_CACHE_HOME``; "": ``~/.cache``).
        in_rank_order: choose only among algorithms that reduce in rank order (deterministic mode).
        lines: what the group's shared-memory lines take, where its transport has them.

    Raises:
        ValueError: an unknown algorithm name (listing the choices), or an unreadable cost profile.
    """
    name, dtype = requested or "auto", resolve(dtype or np.float32)
    allowed = algorithms.in_rank_order(collective, size) if in_rank_order else algorithms.names(collective)
    if name != "auto":
        algorithms.get(collective, name)  # raises with the list of names
        if name in allowed:
            return name
    elif forced != "auto":
        if forced in allowed:
            return forced
    elif (taken := on_lines(collective, nbytes, dtype.itemsize, lines)) in allowed:
        return taken
    whole = nbytes * size if collectives.get(collective).split else nbytes
    return _best(collective, whole, size, hosts, str(dtype), dtype.itemsize, transport,
                 costmodel.load(profile, cache_home), algorithms.anywhere(collective, allowed))


def on_lines(collective: str, nbytes: int, itemsize: int, lines: LineLimits | None) -> str | None:
    """``"lines"`` or ``"chunked_lines"`` where an auto call of ``nbytes`` per rank takes the ``lines``
    (their one round up to ``at_once`` bytes per rank, else chunks up to ``chunked_max``), else ``None``."""
    if lines is None:
        return None
    if collective in line_schedules.ONE_ROUND and lines.at_once and nbytes <= lines.at_once:
        return "lines"
    if collective in line_schedules.CHUNKED and nbytes <= lines.chunked_max and itemsize <= lines.capacity:
        return "chunked_lines"
    return None


def options(name: str, itemsize: int, lines: LineLimits | None) -> dict:
    """The schedule options that make ``name`` run as the ``lines`` do: ``chunked_lines``' chunk is a line."""
    return {"chunk": lines.chunk(itemsize)} if name == "chunked_lines" and lines is not None else {}


@functools.lru_cache(maxsize=4096)
def _best(collective: str, nbytes: int, size: int, hosts: int, dtype: str, itemsize: int, transport: str,
          profile: costmodel.Profile, candidates: tuple[str, ...]) -> str:
    return costmodel.best(collective, nbytes, size, profile.network(hosts, dtype, transport), itemsize, candidates)
