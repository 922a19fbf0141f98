"""The registry of schedules: for each collective, the algorithms that implement it, by name.

Every entry is a pure function ``fn(rank, size, count, *, root=0, **options) -> Schedule`` (see
``schedule.py`` for what ``count`` means per collective); options are keyword-only with defaults, so
an unknown one raises ``TypeError``. ``verify.py`` checks any entry symbolically, without processes.
"""

from __future__ import annotations

from types import MappingProxyType

from . import binomial, chain, dissemination, pairwise, ring, tree

_REGISTRY = MappingProxyType({
    "all_reduce": {"ring": ring.all_reduce, "tree": tree.all_reduce, "reduce_bcast": binomial.all_reduce},
    "reduce": {"binomial": binomial.reduce},
    "broadcast": {"binomial": binomial.broadcast, "pipeline": chain.broadcast},
    "all_gather": {"ring": ring.all_gather},
    "reduce_scatter": {"ring": ring.reduce_scatter},
    "all_to_all": {"pairwise": pairwise.all_to_all},
    "gather": {"binomial": binomial.gather},
    "scatter": {"binomial": binomial.scatter},
    "barrier": {"dissemination": dissemination.barrier},
})

COLLECTIVES: tuple[str, ...] = tuple(_REGISTRY)

ROOTED: frozenset[str] = frozenset({"reduce", "broadcast", "gather", "scatter"})  # take a meaningful root

DEFAULTS: dict[str, str] = {
    "all_reduce": "ring",
    "reduce": "binomial",
    "broadcast": "binomial",
    "all_gather": "ring",
    "reduce_scatter": "ring",
    "all_to_all": "pairwise",
    "gather": "binomial",
    "scatter": "binomial",
    "barrier": "dissemination",
}


def names(collective: str) -> tuple[str, ...]:
    """The algorithm names registered for ``collective``; ``ValueError`` for an unknown collective."""
    return tuple(_algorithms(collective))


def get(collective: str, name: str):
    """The schedule function ``name`` for ``collective``.

    Raises:
        ValueError: for an unknown collective (listing the known ones) or an unknown algorithm
            (listing the collective's algorithms).

    Example: ``get("all_reduce", "ring")(0, 2, 4)`` is rank 0's ring schedule for 4 elements on 2 ranks.
    """
    algorithms = _algorithms(collective)
    try:
        return algorithms[name]
    except KeyError:
        raise ValueError(
            f"unknown {collective} algorithm {name!r}; known: {', '.join(algorithms)}"
        ) from None


def _algorithms(collective: str) -> dict:
    try:
        return _REGISTRY[collective]
    except KeyError:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}") from None
