"""Pairwise-exchange all-to-all: in each step every rank trades one block with one peer.

Vocabulary: ``data`` and ``out`` hold ``n`` *blocks* of ``count`` elements, block ``j`` meaning
"for rank ``j``" in ``data`` and "from rank ``j``" in ``out``. In *step* ``s`` (``1 <= s < n``) rank
``r`` sends its block ``r + s`` to rank ``r + s`` and receives block ``r - s`` from rank ``r - s``
(mod ``n``); its own block is copied locally at the start. Each step is a permutation, so every rank
sends and receives exactly one block per step and no rank is a hot spot.

Cost (``m`` bytes per block, alpha per message, beta per byte): ``(n - 1) (alpha + m beta)``.
"""

from __future__ import annotations

from functools import lru_cache

from .schedule import Copy, Recv, Region, Schedule, Send, check_call, without_empty


@lru_cache(maxsize=1024)
def all_to_all(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Pairwise all-to-all: ``out`` block ``j`` on rank ``r`` becomes rank ``j``'s ``data`` block ``r``.

    Args:
        rank, size: this rank and the world size.
        count: elements per block (``data`` and ``out`` hold ``size * count``).
        root: ignored.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, count 1): rank 0 copies ``data[0]`` to ``out[0]``, sends ``data[1]`` to
    rank 1 and receives rank 1's ``data[0]`` into ``out[1]``.
    """
    check_call(rank, size, count, root)

    def block(buf: str, j: int) -> Region:
        return Region(buf, j * count, (j + 1) * count)

    peers = [((rank + s) % size, (rank - s) % size) for s in range(1, size)]
    steps = [[Send(to, block("data", to)), Recv(frm, block("out", frm))] for to, frm in peers] or [[]]
    steps[0].insert(0, Copy(block("data", rank), block("out", rank)))
    return Schedule(without_empty(steps))


def all_to_all_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_to_all` on ``n`` ranks, ``m`` bytes in each rank's buffer."""
    return (n - 1) * (alpha + m / n * beta)
