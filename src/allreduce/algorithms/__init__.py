"""The registry of schedules: for each collective, the algorithms that implement it, by name.

Every entry is a pure function ``fn(rank, size, count, *, root=0, **options) -> Schedule`` (see
``schedule.py`` for what ``count`` means per collective); options are keyword-only with defaults, so
an unknown one raises ``TypeError``. ``verify.py`` checks any entry symbolically, without processes.

Every entry also has a price, :data:`COSTS`: ``cost(n, m, alpha, beta, gamma) -> seconds`` on ``n``
ranks, with ``alpha`` seconds per message, ``beta`` per byte sent and ``gamma`` per byte reduced, and
``m`` the bytes nccl-tests would report for the call: the tensor (all_reduce, reduce, broadcast), the
whole gathered or reduced-input buffer (all_gather, reduce_scatter, gather, scatter: ``n`` blocks),
one rank's buffer (all_to_all); barrier ignores it. Pipelined algorithms are priced at their best
chunk count; their ``cost`` takes ``chunk_bytes=`` to price a fixed chunk instead.
"""

from __future__ import annotations

from types import MappingProxyType

from . import (binomial, bruck, chain, direct, dissemination, double_tree, hierarchical, pairwise, rabenseifner,
               recursive_doubling, recursive_halving, ring, tree)

# collective -> algorithm name -> (schedule function, cost function)
_ENTRIES = {
    "all_reduce": {
        "ring": (ring.all_reduce, ring.all_reduce_cost),
        "tree": (tree.all_reduce, tree.all_reduce_cost),
        "reduce_bcast": (binomial.all_reduce, binomial.all_reduce_cost),
        "recursive_doubling": (recursive_doubling.all_reduce, recursive_doubling.all_reduce_cost),
        "rabenseifner": (rabenseifner.all_reduce, rabenseifner.all_reduce_cost),
        "double_tree": (double_tree.all_reduce, double_tree.all_reduce_cost),
        "direct": (direct.all_reduce, direct.all_reduce_cost),
        "hierarchical": (hierarchical.all_reduce, hierarchical.all_reduce_cost),
    },
    "reduce": {"binomial": (binomial.reduce, binomial.reduce_cost)},
    "broadcast": {
        "binomial": (binomial.broadcast, binomial.broadcast_cost),
        "pipeline": (chain.broadcast, chain.broadcast_cost),
    },
    "all_gather": {
        "ring": (ring.all_gather, ring.all_gather_cost),
        "bruck": (bruck.all_gather, bruck.all_gather_cost),
        "direct": (direct.all_gather, direct.all_gather_cost),
    },
    "reduce_scatter": {
        "ring": (ring.reduce_scatter, ring.reduce_scatter_cost),
        "recursive_halving": (recursive_halving.reduce_scatter, recursive_halving.reduce_scatter_cost),
        "direct": (direct.reduce_scatter, direct.reduce_scatter_cost),
    },
    "all_to_all": {
        "pairwise": (pairwise.all_to_all, pairwise.all_to_all_cost),
        "bruck": (bruck.all_to_all, bruck.all_to_all_cost),
    },
    "gather": {"binomial": (binomial.gather, binomial.gather_cost)},
    "scatter": {"binomial": (binomial.scatter, binomial.scatter_cost)},
    "barrier": {"dissemination": (dissemination.barrier, dissemination.barrier_cost)},
}

_REGISTRY = MappingProxyType({c: {name: fn for name, (fn, _) in algos.items()} for c, algos in _ENTRIES.items()})

COSTS = MappingProxyType({(c, name): cost for c, algos in _ENTRIES.items() for name, (_, cost) in algos.items()})
"""``COSTS[(collective, name)](n, m, alpha, beta, gamma)``: predicted seconds (see the module docstring)."""

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
