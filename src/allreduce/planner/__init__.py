"""Chooses the algorithm for a collective when the caller says ``"auto"``.

"auto" takes the registered algorithm with the smallest predicted time on this machine's cost profile
(:mod:`allreduce.planner.costmodel`: measured by ``allreduce tune``, else built-in defaults) for the
message size, world size and number of hosts.
Algorithms without a cost formula are not candidates; a collective with none keeps its default.
A forced algorithm (``ALLREDUCE_ALGO``, passed in as ``forced``) overrides the choice wherever the
named algorithm exists for the collective. In deterministic mode (``in_rank_order``, see
:mod:`.determinism`) the candidates are only the algorithms that reduce in rank order, and a named or
forced algorithm that does not is replaced by the fastest one that does.
``allreduce plan`` prints the predictions behind a choice.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import algorithms, collectives
from . import costmodel


def choose(collective: str, requested: str | None, nbytes: int, size: int, *, hosts: int = 1,
           dtype=None, transport: str = "tcp", forced: str = "auto", profile: str = "", cache_home: str = "",
           in_rank_order: bool = False) -> str:
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

    Raises:
        ValueError: an unknown algorithm name (listing the choices), or an unreadable cost profile.
    """
    name = requested or "auto"
    allowed = algorithms.in_rank_order(collective, size) if in_rank_order else algorithms.names(collective)
    if name != "auto":
        algorithms.get(collective, name)  # raises with the list of names
        if name in allowed:
            return name
    elif forced != "auto" and forced in allowed:
        return forced
    dtype = np.dtype(dtype or np.float32)
    whole = nbytes * size if collectives.get(collective).split else nbytes
    return _best(collective, whole, size, hosts, str(dtype), dtype.itemsize, transport,
                 costmodel.load(profile, cache_home), allowed)


@functools.lru_cache(maxsize=4096)
def _best(collective: str, nbytes: int, size: int, hosts: int, dtype: str, itemsize: int, transport: str,
          profile: costmodel.Profile, candidates: tuple[str, ...]) -> str:
    return costmodel.best(collective, nbytes, size, profile.network(hosts, dtype, transport), itemsize, candidates)
