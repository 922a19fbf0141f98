"""Pipelined chain broadcast: the root's data flows down a line of ranks, chunk by chunk.

Vocabulary: ranks are renumbered so the root is *virtual rank* 0 (``v = (r - root) mod n``) and form
a *chain* ``0 -> 1 -> ... -> n - 1``. The buffer is cut into ``K`` near-equal pipeline *chunks* of at
most ``chunk`` elements. Virtual rank ``v`` receives chunk ``k`` from ``v - 1`` in *step*
``k + v - 1`` and forwards it to ``v + 1`` in step ``k + v``, so once the pipeline is full every link
carries one chunk per step.

Cost (``m`` bytes, alpha per message, beta per byte): ``(K + n - 2) (alpha + (m/K) beta)``; for large
``m`` this approaches ``m beta`` whatever ``n`` is, which a binomial tree (``log2 n · m beta``) cannot.
"""

from __future__ import annotations

from functools import lru_cache

from .cost import chunks_of, pipelined
from .schedule import Recv, Schedule, Send, check_call, pipeline_bounds, region, without_empty

DEFAULT_CHUNK = 1 << 16  # elements per pipeline chunk


@lru_cache(maxsize=1024)
def broadcast(rank: int, size: int, count: int, *, root: int = 0, chunk: int = DEFAULT_CHUNK) -> Schedule:
    """Pipelined chain broadcast: every rank's ``data`` becomes the root's.

    Args:
        rank, size, root: this rank, the world size and the rank whose data is sent.
        count: elements in the tensor.
        chunk: elements per pipeline chunk (at least 1).

    Raises:
        ValueError: for a rank, root or count out of range, or ``chunk < 1``.

    Example (2 ranks, root 0, 4 elements, chunk 2): rank 0 sends ``data[0:2]`` in step 0 and
    ``data[2:4]`` in step 1; rank 1 receives them in the same steps.
    """
    check_call(rank, size, count, root)
    bounds = pipeline_bounds(count, chunk)
    chunks = len(bounds) - 1
    v = (rank - root) % size
    prev, succ = (rank - 1) % size, (rank + 1) % size
    steps = []
    for t in range(chunks + size - 2 if chunks and size > 1 else 0):
        ops = []
        if v > 0 and 0 <= t - v + 1 < chunks:
            ops.append(Recv(prev, region("data", bounds, t - v + 1)))
        if v < size - 1 and 0 <= t - v < chunks:
            ops.append(Send(succ, region("data", bounds, t - v)))
        steps.append(ops)
    return Schedule(without_empty(steps))


def broadcast_cost(n: int, m: float, alpha: float, beta: float, gamma: float, *,
                   chunk_bytes: float | None = None) -> float:
    """Predicted seconds of :func:`broadcast` on ``n`` ranks for ``m`` bytes (see the module docstring).

    ``chunk_bytes`` fixes the pipeline chunk (``DEFAULT_CHUNK`` times the item size is what runs by
    default); ``None`` prices the best chunk count.
    """
    if n == 1:
        return 0.0
    return pipelined(n - 2, alpha, m * beta, (n - 2) * m * beta, chunks_of(m, chunk_bytes))
