"""The registry of schedules: for each collective, the algorithms that implement it, by name.

Every entry is an :class:`Algorithm` that says what it is: its schedule function, its cost formula,
the options it takes (with their defaults), what it needs from the group, and the properties the
simulator relies on. Nothing reads a function's signature: the entry is the whole truth.

A schedule function is pure, ``fn(rank, size, count, *, root=0, **options) -> Schedule`` (see
``schedule.py`` for what ``count`` means per collective). Calling the entry checks the option names
(an unknown one is a ``TypeError`` listing the valid ones) and fills in the declared defaults.
``verify.py`` checks any entry symbolically, without processes.

A cost formula is ``cost(n, m, alpha, beta, gamma) -> seconds`` on ``n`` ranks, with ``alpha``
seconds per message, ``beta`` per byte sent and ``gamma`` per byte reduced, and ``m`` the bytes
nccl-tests would report for the call: the tensor (all_reduce, reduce, broadcast), the whole gathered
or reduced-input buffer (all_gather, reduce_scatter, gather, scatter: ``n`` blocks), one rank's
buffer (all_to_all); barrier ignores it. A pipelined entry (one with a ``chunk`` option) is priced at
its best chunk count (``chunked_lines`` at a line, which fixes it); its ``cost`` takes ``chunk_bytes=``
to price a fixed chunk instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from collections.abc import Callable, Mapping

from .. import collectives
from . import (binomial, bruck, chain, direct, dissemination, double_tree, hierarchical, lines, ordered, pairwise,
               rabenseifner, recursive_doubling, recursive_halving, ring, tree)
from .schedule import Schedule


@dataclass(frozen=True, eq=False)  # an entry is itself: hashable, compared by identity
class Algorithm:
    """One registry entry; calling it builds a rank's schedule (see the module docstring).

    Example: ``get("all_reduce", "ring")(0, 2, 4)`` is rank 0's ring schedule for 4 elements on 2 ranks.
    """

    collective: str
    name: str
    schedule: Callable[..., Schedule]  # fn(rank, size, count, *, root=0, **options)
    cost: Callable[..., float] | None  # cost(n, m, alpha, beta, gamma); None: no formula, never chosen by auto
    options: Mapping[str, Any] = field(default_factory=dict)  # option -> default; "chunk": elements per chunk
    needs: tuple[str, ...] = ()  # options the caller must supply from the group: "hosts" (each host's ranks)
    # with its default options (any chunk), every rank is rank 0 rotated: the simulator times a cell
    shift_invariant: bool = False
    one_chunk_per_rank: bool = False  # cuts ``count`` (each chunk of it) into one piece per rank (a cell rounds it up)
    in_rank_order: bool = False  # reduces every element as the left fold over ranks in rank order, at any size
    # "any": runs on every transport; "lines": a protocol of the shared-memory lines (``lines.py``), which auto
    # picks only where the group's transport has them (``planner.choose(lines=...)``); named, it runs anywhere
    medium: str = "any"
    # (size, count, **options) -> [(parents, depths, chunk bounds)]: the pipelined trees it runs (``tree.py``),
    # which the simulator times without building every rank's schedule
    trees: Callable[..., list] | None = None

    def __post_init__(self):
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def __call__(self, rank: int, size: int, count: int, *, root: int = 0, **options) -> Schedule:
        """This rank's schedule; ``TypeError`` for an option the entry does not take."""
        unknown = options.keys() - self.options.keys() - set(self.needs) if options else ()
        if unknown:
            valid = ", ".join([*self.options, *self.needs]) or "none"
            raise TypeError(f"{self.collective} algorithm {self.name!r} takes no option {', '.join(sorted(unknown))}; "
                            f"its options: {valid}")
        return self.schedule(rank, size, count, root=root, **{**self.options, **options})


def _hierarchical(rank: int, size: int, count: int, *, root: int = 0, hosts=None, cross: str) -> Schedule:
    """The hierarchical all-reduce with its cross-host all-reduce named; the name is looked up here, so
    ``hierarchical.py`` takes the entry itself and imports no registry."""
    return hierarchical.all_reduce(rank, size, count, root=root, hosts=hosts, cross=get("all_reduce", cross))


_CHUNK = {"chunk": tree.DEFAULT_CHUNK}

ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm("all_reduce", "ring", ring.all_reduce, ring.all_reduce_cost,
              shift_invariant=True, one_chunk_per_rank=True),
    Algorithm("all_reduce", "tree", tree.all_reduce, tree.all_reduce_cost, _CHUNK, trees=tree.pipelines),
    Algorithm("all_reduce", "reduce_bcast", binomial.all_reduce, binomial.all_reduce_cost),
    Algorithm("all_reduce", "recursive_doubling", recursive_doubling.all_reduce, recursive_doubling.all_reduce_cost),
    Algorithm("all_reduce", "rabenseifner", rabenseifner.all_reduce, rabenseifner.all_reduce_cost),
    Algorithm("all_reduce", "double_tree", double_tree.all_reduce, double_tree.all_reduce_cost, _CHUNK,
              trees=double_tree.pipelines),
    Algorithm("all_reduce", "direct", direct.all_reduce, direct.all_reduce_cost,
              shift_invariant=True, one_chunk_per_rank=True),
    # invariant under a shift by one host
    Algorithm("all_reduce", "hierarchical", _hierarchical, hierarchical.all_reduce_cost,
              {"cross": "ring"}, needs=("hosts",), shift_invariant=True, one_chunk_per_rank=True),
    # its messages are invariant under a shift (only its slots and the order of its fold depend on the rank)
    Algorithm("all_reduce", "ordered", ordered.all_reduce, ordered.all_reduce_cost, shift_invariant=True,
              one_chunk_per_rank=True, in_rank_order=True),
    Algorithm("reduce", "binomial", binomial.reduce, binomial.reduce_cost),
    Algorithm("reduce", "ordered", ordered.reduce, ordered.all_reduce_cost, one_chunk_per_rank=True,
              in_rank_order=True),
    Algorithm("broadcast", "binomial", binomial.broadcast, binomial.broadcast_cost),
    Algorithm("broadcast", "pipeline", chain.broadcast, chain.broadcast_cost, {"chunk": chain.DEFAULT_CHUNK}),
    Algorithm("all_gather", "ring", ring.all_gather, ring.all_gather_cost, shift_invariant=True),
    # Bruck's messages are cut in two where their blocks wrap past rank n - 1, on some ranks only; the
    # pieces go to the same peer in the same step, and the finishing time is the same (tests/unit/test_sim.py)
    Algorithm("all_gather", "bruck", bruck.all_gather, bruck.all_gather_cost, shift_invariant=True),
    Algorithm("all_gather", "direct", direct.all_gather, direct.all_gather_cost, shift_invariant=True),
    Algorithm("reduce_scatter", "ring", ring.reduce_scatter, ring.reduce_scatter_cost, shift_invariant=True),
    Algorithm("reduce_scatter", "recursive_halving", recursive_halving.reduce_scatter,
              recursive_halving.reduce_scatter_cost),
    Algorithm("reduce_scatter", "direct", direct.reduce_scatter, direct.reduce_scatter_cost, shift_invariant=True),
    Algorithm("reduce_scatter", "ordered", ordered.reduce_scatter, ordered.reduce_scatter_cost, shift_invariant=True,
              in_rank_order=True),
    Algorithm("all_to_all", "pairwise", pairwise.all_to_all, pairwise.all_to_all_cost, shift_invariant=True),
    Algorithm("all_to_all", "bruck", bruck.all_to_all, bruck.all_to_all_cost, shift_invariant=True),
    Algorithm("gather", "binomial", binomial.gather, binomial.gather_cost),
    Algorithm("scatter", "binomial", binomial.scatter, binomial.scatter_cost),
    Algorithm("barrier", "dissemination", dissemination.barrier, dissemination.barrier_cost, shift_invariant=True),
    # the shared-memory lines: one round, and all-reduces and reduces in chunks of a line
    Algorithm("all_reduce", "lines", lines.all_reduce, lines.reduce_cost, shift_invariant=True, in_rank_order=True,
              medium="lines"),
    Algorithm("reduce", "lines", lines.reduce, lines.reduce_cost, in_rank_order=True, medium="lines"),
    Algorithm("broadcast", "lines", lines.broadcast, lines.broadcast_cost, medium="lines"),
    Algorithm("all_gather", "lines", direct.all_gather, lines.all_gather_cost, shift_invariant=True, medium="lines"),
    Algorithm("barrier", "lines", lines.barrier, lines.barrier_cost, shift_invariant=True, medium="lines"),
    Algorithm("all_reduce", "chunked_lines", lines.chunked_all_reduce, lines.chunked_cost,
              {"chunk": lines.DEFAULT_CHUNK}, shift_invariant=True, one_chunk_per_rank=True, in_rank_order=True,
              medium="lines"),
    Algorithm("reduce", "chunked_lines", lines.chunked_reduce, lines.chunked_cost, {"chunk": lines.DEFAULT_CHUNK},
              in_rank_order=True, medium="lines"),
)

_REGISTRY = MappingProxyType({c: {a.name: a for a in ALGORITHMS if a.collective == c}
                              for c in dict.fromkeys(a.collective for a in ALGORITHMS)})

COLLECTIVES: tuple[str, ...] = tuple(c for c in collectives.NAMES if c in _REGISTRY)  # those with schedules

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


def in_rank_order(collective: str, size: int) -> tuple[str, ...]:
    """The algorithms of ``collective`` that reduce in rank order on ``size`` ranks: those that always do,
    and on two ranks every one (a sum or product of two terms is the same in either order)."""
    return tuple(a.name for a in _algorithms(collective).values() if a.in_rank_order or size <= 2)


def names(collective: str) -> tuple[str, ...]:
    """The algorithm names registered for ``collective``; ``ValueError`` for an unknown collective."""
    return tuple(_algorithms(collective))


def anywhere(collective: str, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``candidates`` that run on any transport (the lines' own are left out)."""
    return tuple(name for name in candidates if get(collective, name).medium == "any")


def get(collective: str, name: str) -> Algorithm:
    """The registry entry ``name`` for ``collective``.

    Raises:
        ValueError: for an unknown collective (listing the known ones) or an unknown algorithm
            (listing the collective's algorithms).

    Example: ``get("all_reduce", "ring").shift_invariant`` is ``True``.
    """
    algorithms = _algorithms(collective)
    try:
        return algorithms[name]
    except KeyError:
        raise ValueError(
            f"unknown {collective} algorithm {name!r}; known: {', '.join(algorithms)}"
        ) from None


def _algorithms(collective: str) -> dict[str, Algorithm]:
    try:
        return _REGISTRY[collective]
    except KeyError:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}") from None
