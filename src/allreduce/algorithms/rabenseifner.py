"""Rabenseifner all-reduce: recursive-halving reduce-scatter, then recursive-doubling all-gather.

Vocabulary (shared with ``fold.py``): a world of ``n`` ranks is *folded* onto ``p``, the largest power
of two ``<= n``, by a *fold step* (each odd rank among the first ``2 (n - p)`` hands its tensor to its
even neighbour, which reduces it in) and an *unfold step* (the result goes back); the ``p``
*survivors* (virtual ranks ``v``) cut the tensor into ``p`` near-equal *blocks*
(:func:`chunk_bounds`). Reduce-scatter: in round ``k`` survivor ``v`` pairs with ``v ^ 2^k``; of
the *window* of blocks both still work on, it keeps one half, sends the other, and reduces the
partner's copy of its half into its own. After ``log2 p`` rounds its window is one block, reduced
over every rank. All-gather: the same rounds backwards, each rank sending its window and receiving
the partner's, until every survivor holds the whole result.

The smallest distance goes first, so the largest exchanges are between neighbouring ranks (on the
same host when hosts hold consecutive ranks). Each block is reduced on one rank only and then
copied, so every rank ends with the same bits.

Cost (``m`` bytes, alpha per message, beta per byte, gamma per byte reduced, ``p`` and ``L = log2 p``
as above): ``2 L alpha + 2 (p-1)/p m beta + (p-1)/p m gamma``, plus ``2 alpha + 2 m beta + m gamma``
for the fold when ``n`` is not a power of two. Ring's bandwidth in ``2 log2 p`` rounds instead of
``2 (n - 1)``.
"""

from __future__ import annotations

from functools import lru_cache

from .cost import log2_floor
from .fold import fold, folded_partner, framed, halving, real, sitting_out, virtual
from .schedule import Recv, Region, Schedule, Send, check_call, without_empty


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Rabenseifner all-reduce of ``count`` elements in place in ``data``.

    ``2 log2 p`` steps (``p`` the largest power of two ``<= n``), two more when ``n`` is not ``p``.

    Args:
        rank, size: this rank and the world size.
        count: elements in the tensor.
        root: ignored (all-reduce has none).

    Returns:
        This rank's :class:`Schedule`; no scratch.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, 4 elements): in step 0 rank 0 sends ``data[2:4]`` and reduces rank 1's
    ``data[0:2]`` into its own; in step 1 it sends the finished ``data[0:2]`` and receives the
    finished ``data[2:4]``.
    """
    check_call(rank, size, count, root)
    p, _ = fold(size)
    whole = Region("data", 0, count)
    v = virtual(rank, size)
    if v is None:
        return sitting_out(folded_partner(rank, size), whole, whole, 2 * log2_floor(p))

    def blocks(window: tuple[int, int]) -> Region:  # block boundaries as chunk_bounds(count, p) has them
        return Region("data", window[0] * count // p, window[1] * count // p)

    rounds = [(real(peer, size), blocks(keep), blocks(give)) for peer, keep, give in halving(v, p, largest_first=False)]
    steps = [[Send(peer, give), Recv(peer, keep, reduce=keep)] for peer, keep, give in rounds]
    steps += [[Send(peer, keep), Recv(peer, give)] for peer, keep, give in reversed(rounds)]
    steps = framed(rank, size, steps, lambda q: [Recv(q, whole, reduce=whole)], lambda q: [Send(q, whole)])
    return Schedule(without_empty(steps))


def all_reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_reduce` on ``n`` ranks for ``m`` bytes (see the module docstring)."""
    p, rem = fold(n)
    share = (p - 1) / p * m
    folding = 2 * alpha + 2 * m * beta + m * gamma if rem else 0.0
    return 2 * log2_floor(p) * alpha + 2 * share * beta + share * gamma + folding
