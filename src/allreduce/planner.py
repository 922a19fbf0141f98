"""Chooses the algorithm for a collective when the caller says ``"auto"``.

The rule is the classic one: latency-bound sizes take the algorithm with the fewest message rounds,
bandwidth-bound sizes the ring, which puts the fewest bytes on each link. ``ALLREDUCE_ALGO`` overrides
the choice for the whole job wherever the named algorithm exists for the collective.
"""

from __future__ import annotations

import os

from . import algorithms

SMALL_ALL_REDUCE = 32 << 10  # bytes; below this the round count, not the volume, decides


def choose(collective: str, requested: str | None, nbytes: int, size: int) -> str:
    """The registered algorithm to run; ``ValueError`` (listing the choices) for an unknown name."""
    name = requested or "auto"
    if name == "auto":
        forced = os.environ.get("ALLREDUCE_ALGO", "auto")
        if forced != "auto" and forced in algorithms.names(collective):
            return forced
        if collective == "all_reduce":
            return "reduce_bcast" if nbytes <= SMALL_ALL_REDUCE else "ring"
        return algorithms.DEFAULTS[collective]
    algorithms.get(collective, name)  # raises with the list of names
    return name
