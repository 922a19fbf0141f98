"""Double binary tree all-reduce: two complementary trees, each reducing and broadcasting half the tensor.

Vocabulary: a *tree* here is the in-order binary tree on *labels* ``1..n``: the root is the label
with the most trailing zero bits (the largest power of two ``<= n``), and each side of a label is
again such a tree over the labels on that side. A label's depth never exceeds ``D = floor(log2 n)``.
Odd labels are *leaves* (any run of two or more labels holds an even one, which has more trailing
zeros) and every even label is *interior* (its left side holds at least the odd label below it).

*Tree 1* gives rank ``r`` label ``r + 1``, so its interior ranks are the odd ones. *Tree 2* is tree 1
with every rank moved one place along the ring: rank ``r`` takes the place of rank ``r - 1`` (mod
``n``), so its interior ranks are even ones. Hence every rank is interior in at most one tree: it
forwards (and reduces) for one tree only.

The tensor is cut into two *halves*; tree ``t`` carries half ``t`` as ``tree.py`` carries the whole
tensor: cut into pipeline *chunks* of at most ``chunk`` elements, reduced up to the root and
broadcast back down, chunk ``k`` moving one level per *step*. Both trees run in the same steps. Each
chunk is reduced once, on the way up, and then copied down, so every rank ends with the same bits.

Cost (``m`` bytes, alpha per message, beta per byte, gamma per byte reduced; ``K`` chunks per half,
of ``c = m / 2K`` bytes each): about ``(K + 2D - 1) alpha + (4K + 2D) c beta + 2 (K + D - 1) c gamma``.
While both phases overlap a rank sends four chunks per step (up and down its interior tree, up the
other) and reduces two; filling and draining the pipeline add about ``2D`` chunks sent and
``2 (D - 1)`` reduced. Bandwidth near the ring's (``2 m beta``), latency near a tree's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import zip_longest

from .cost import chunks_of, log2_floor, pipelined
from .schedule import Schedule, check_call, chunk_bounds, pipeline_bounds, without_empty
from .tree import DEFAULT_CHUNK, pipeline_steps


@dataclass(frozen=True)
class Tree:
    """A tree over ranks ``0..n-1``: per rank, its parent (``None`` at the root), children and depth."""

    parent: tuple
    children: tuple
    depth: tuple

    @property
    def top(self) -> int:
        """The depth of the deepest rank."""
        return max(self.depth)


@lru_cache(maxsize=64)
def trees(size: int) -> tuple[Tree, Tree]:
    """The two trees of a world of ``size`` ranks (``ValueError`` if it is below 1)."""
    if size < 1:
        raise ValueError(f"world size must be at least 1, got {size}")
    parent, children, depth = [None] * size, [[] for _ in range(size)], [0] * size
    pending = [(1, size, None, 0)]  # (first label, last label, parent label, depth) of each side
    while pending:
        lo, hi, up, d = pending.pop()
        if lo > hi:
            continue
        label = hi
        while label & (label - 1) and label & (label - 1) >= lo:
            label &= label - 1  # clear the lowest set bit while staying in [lo, hi]
        if up is not None:
            parent[label - 1] = up - 1
            children[up - 1].append(label - 1)
        depth[label - 1] = d
        pending += [(lo, label - 1, label, d + 1), (label + 1, hi, label, d + 1)]
    first = Tree(tuple(parent), tuple(tuple(sorted(c)) for c in children), tuple(depth))
    return first, _moved_along(first, size)


def _moved_along(tree: Tree, size: int) -> Tree:
    """``tree`` with every rank ``q`` replaced by rank ``q + 1`` (mod ``size``)."""
    def at(r: int) -> int:
        return (r - 1) % size

    return Tree(
        tuple(None if tree.parent[at(r)] is None else (tree.parent[at(r)] + 1) % size for r in range(size)),
        tuple(tuple((c + 1) % size for c in tree.children[at(r)]) for r in range(size)),
        tuple(tree.depth[at(r)] for r in range(size)),
    )


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0, chunk: int = DEFAULT_CHUNK) -> Schedule:
    """Double binary tree all-reduce of ``count`` elements in place in ``data``.

    Args:
        rank, size: this rank and the world size.
        count: elements in the tensor.
        root: ignored (the trees' roots are fixed by the world size).
        chunk: elements per pipeline chunk (at least 1).

    Returns:
        This rank's :class:`Schedule`; no scratch.

    Raises:
        ValueError: for a rank, root or count out of range, or ``chunk < 1``.

    Example (2 ranks, 4 elements): tree 1 is rank 0 under rank 1, tree 2 rank 1 under rank 0. In
    step 0 rank 0 sends ``data[0:2]`` up tree 1 and reduces rank 1's ``data[2:4]`` into its own; in
    step 1 it sends the finished ``data[2:4]`` down tree 2 and receives the finished ``data[0:2]``.
    """
    check_call(rank, size, count, root)
    halves = chunk_bounds(count, 2)
    pipelines = [[halves[t] + b for b in pipeline_bounds(halves[t + 1] - halves[t], chunk)] for t in (0, 1)]
    if size == 1 or count == 0:
        return Schedule(())
    per_tree = [pipeline_steps(tree.parent[rank], list(tree.children[rank]), tree.depth[rank], tree.top, bounds)
                for tree, bounds in zip(trees(size), pipelines)]
    steps = [first + second for first, second in zip_longest(*per_tree, fillvalue=[])]
    return Schedule(without_empty(steps))


def pipelines(size: int, count: int, *, root: int = 0, chunk: int = DEFAULT_CHUNK) -> list[tuple]:
    """The two pipelined trees :func:`all_reduce` runs, as ``tree.pipelines`` describes one."""
    halves = chunk_bounds(count, 2)
    return [(tuple(-1 if p is None else p for p in tree.parent), tree.depth,
             tuple(halves[t] + b for b in pipeline_bounds(halves[t + 1] - halves[t], chunk)))
            for t, tree in enumerate(trees(size))]


def all_reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float, *,
                    chunk_bytes: float | None = None) -> float:
    """Predicted seconds of :func:`all_reduce` on ``n`` ranks for ``m`` bytes (see the module docstring).

    ``chunk_bytes`` fixes the pipeline chunk (``DEFAULT_CHUNK`` times the item size is what runs by
    default); ``None`` prices the best chunk count.
    """
    if n == 1:
        return 0.0
    depth = log2_floor(n)
    extra = m * (depth * beta + (depth - 1) * gamma)
    return pipelined(2 * depth - 1, alpha, m * (2 * beta + gamma), extra, chunks_of(m / 2, chunk_bytes))
