"""Pipelined binary-tree all-reduce: reduce up to rank 0, broadcast back down, chunk by chunk.

Vocabulary: the ranks form a binary *tree* in heap order (rank ``r``'s *children* are ``2r + 1`` and
``2r + 2``, its *parent* ``(r - 1) // 2``, its *depth* ``floor(log2(r + 1))``; the tree is as
shallow as a binary tree can be, depth ``D = floor(log2 n)``). The buffer is cut into ``K``
near-equal pipeline *chunks* of at most ``chunk`` elements. Each *step* moves at most one chunk
along each tree edge in each direction.

Reduce phase: a rank at depth ``d`` receives chunk ``k`` from its children in step ``k + D - d - 1``,
reducing both into its own ``data`` in place, and sends the reduced chunk to its parent in step
``k + D - d``. Broadcast phase: rank 0 holds the finished chunk ``k`` after step ``k + D - 1`` and
sends it down in step ``k + D``; a rank at depth ``d`` receives it in step ``k + D + d - 1`` and
forwards it in step ``k + D + d``. So while a rank forwards chunk ``k`` up it already receives
chunk ``k + 1`` from below, and the two phases overlap; all ``K + 2D - 1`` steps are busy. The
timing needs only each rank's depth, so :func:`pipeline_steps` runs it over any tree (the double
binary tree of ``double_tree.py`` is one).

Cost (``m`` bytes, alpha per message, beta per byte, gamma per byte reduced): about ``(K + 2D - 1)
alpha + (K + D - 1) (m/K) (3 beta + 2 gamma)``. While both phases overlap an interior rank sends a
chunk up and one to each child, and reduces two, per step; filling and draining the pipeline adds
about ``D - 1`` such steps. Few large chunks favour bandwidth, many small ones hide the fill, and
``K = sqrt((D - 1) m (3 beta + 2 gamma) / alpha)`` balances them.
"""

from __future__ import annotations

from functools import lru_cache

from .cost import chunks_of, log2_floor, pipelined
from .schedule import Recv, Schedule, Send, check_call, pipeline_bounds, region, without_empty

DEFAULT_CHUNK = 1 << 16  # elements per pipeline chunk


def _depth(rank: int) -> int:
    return (rank + 1).bit_length() - 1


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0, chunk: int = DEFAULT_CHUNK) -> Schedule:
    """Pipelined binary-tree all-reduce of ``count`` elements in place in ``data``.

    Args:
        rank, size: this rank and the world size.
        count: elements in the tensor.
        root: ignored (the tree's root is always rank 0).
        chunk: elements per pipeline chunk (at least 1).

    Returns:
        This rank's :class:`Schedule`; no scratch.

    Raises:
        ValueError: for a rank, root or count out of range, or ``chunk < 1``.

    Example (2 ranks, 4 elements, chunk 2): step 0 rank 1 sends ``data[0:2]`` up; step 1 it sends
    ``data[2:4]`` up and receives the finished ``data[0:2]``; step 2 it receives ``data[2:4]``.
    """
    check_call(rank, size, count, root)
    bounds = pipeline_bounds(count, chunk)
    if size == 1 or count == 0:
        return Schedule(())
    parent = (rank - 1) // 2 if rank else None
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < size]
    return Schedule(without_empty(pipeline_steps(parent, children, _depth(rank), _depth(size - 1), bounds)))


def pipelines(size: int, count: int, *, root: int = 0, chunk: int = DEFAULT_CHUNK) -> list[tuple]:
    """The one pipelined tree :func:`all_reduce` runs, as ``[(parents, depths, bounds)]``: each rank's
    parent (-1 at the root) and depth, and the chunks' boundaries; enough to time it without building
    every rank's schedule (the simulator does, for thousands of ranks)."""
    return [(tuple((r - 1) // 2 for r in range(size)), tuple(_depth(r) for r in range(size)),
             tuple(pipeline_bounds(count, chunk)))]


def pipeline_steps(parent: int | None, children: list[int], depth: int, top: int, bounds: list[int]) -> list[list]:
    """One rank's steps of the pipelined reduce-then-broadcast above, over any tree.

    Args:
        parent: this rank's parent, ``None`` at the root.
        children: this rank's children.
        depth: this rank's depth (the root's is 0).
        top: the depth of the deepest rank, at least 1.
        bounds: the pipeline chunks' boundaries in ``data`` (they need not start at 0).

    Returns:
        ``K + 2 top - 1`` steps (``K`` chunks), empty ones included, so that every rank of the tree
        that calls this with the same ``top`` and ``bounds`` stays in step.
    """
    chunks = len(bounds) - 1
    steps = []
    for t in range(chunks + 2 * top - 1):
        ops = []
        up_in, up_out = t - (top - depth - 1), t - (top - depth)  # reduce phase
        down_in, down_out = t - (top + depth - 1), t - (top + depth)  # broadcast phase
        if parent is not None and 0 <= up_out < chunks:
            ops.append(Send(parent, region("data", bounds, up_out)))
        if parent is not None and 0 <= down_in < chunks:
            ops.append(Recv(parent, region("data", bounds, down_in)))
        for child in children:
            if 0 <= up_in < chunks:
                dst = region("data", bounds, up_in)
                ops.append(Recv(child, dst, reduce=dst))
            if 0 <= down_out < chunks:
                ops.append(Send(child, region("data", bounds, down_out)))
        steps.append(ops)
    return steps


def all_reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float, *,
                    chunk_bytes: float | None = None) -> float:
    """Predicted seconds of :func:`all_reduce` on ``n`` ranks for ``m`` bytes (see the module docstring).

    ``chunk_bytes`` fixes the pipeline chunk (``DEFAULT_CHUNK`` times the item size is what runs by
    default); ``None`` prices the best chunk count.
    """
    if n == 1:
        return 0.0
    depth, work = log2_floor(n), m * (3 * beta + 2 * gamma)
    return pipelined(2 * depth - 1, alpha, work, (depth - 1) * work, chunks_of(m, chunk_bytes))
