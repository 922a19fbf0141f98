"""Dissemination barrier: ``ceil(log2 n)`` rounds of one-element tokens.

Vocabulary: in *round* ``k`` (one *step* each) rank ``r`` sends a *token* to ``r + 2^k`` and receives
one from ``r - 2^k`` (mod ``n``). After round ``k`` a rank has heard, directly or through others, from
the ``2^(k+1)`` ranks before it, so after ``ceil(log2 n)`` rounds it has heard from all and may
leave: no rank leaves before every rank has entered. Tokens carry no data, but they are one element
long (zero-length messages count as absent); each rank sends from ``tmp[0]`` and receives into
``tmp[1]`` so no step reads what it writes.

Cost (alpha per message): ``ceil(log2 n) alpha``; no rank waits on a single hot spot.
"""

from __future__ import annotations

from functools import lru_cache

from .cost import log2_ceil
from .schedule import Recv, Region, Schedule, Send, check_call

TOKEN_OUT, TOKEN_IN = Region("tmp", 0, 1), Region("tmp", 1, 2)


@lru_cache(maxsize=1024)
def barrier(rank: int, size: int, count: int = 0, *, root: int = 0) -> Schedule:
    """Dissemination barrier; ``count`` and ``root`` are ignored.

    Raises:
        ValueError: for a rank out of range.

    Example (2 ranks): in the one step each rank sends a token to the other and waits for theirs.
    """
    check_call(rank, size, count, root)
    distances = [1 << k for k in range((size - 1).bit_length())]
    steps = tuple((Send((rank + d) % size, TOKEN_OUT), Recv((rank - d) % size, TOKEN_IN)) for d in distances)
    return Schedule(steps, tmp=2 if steps else 0)


def barrier_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`barrier` on ``n`` ranks (``m`` is ignored)."""
    return log2_ceil(n) * alpha
