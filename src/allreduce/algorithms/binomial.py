"""Binomial trees: reduce, broadcast, gather and scatter in ``ceil(log2 n)`` steps, and a
reduce-then-broadcast all-reduce for tiny messages.

Vocabulary: ranks are renumbered so the root is *virtual rank* 0 (``v = (r - root) mod n``). In
*round* ``k`` (bit ``b = 2^k``) a virtual rank ``v`` with ``v mod 2b == b`` talks to its *parent*
``v - b``, and one with ``v mod 2b == 0`` talks to its *child* ``v + b`` when that exists. Reduce
and gather run the rounds upward (``k = 0, 1, ...``: children send to parents), broadcast and scatter
downward (largest bit first: parents send to children); there is one *step* per round. The
*subtree* of ``v > 0`` is the virtual ranks ``[v, v + lowbit(v))`` (cut at ``n``); the root's is all.

Gather and scatter move whole subtrees of *blocks* (``count`` elements per rank): a non-root rank
keeps its subtree's blocks in ``tmp`` in virtual order, the root keeps them in real rank order, so a
message to or from the root is split in two where the virtual range wraps past rank ``n - 1``.
Reduce leaves non-root ``data`` untouched by accumulating in ``tmp``; leaves just send ``data``.

Cost (alpha per message, beta per byte, gamma per byte reduced, ``L = ceil(log2 n)``): with ``m``
bytes of tensor, reduce ``L (alpha + m beta + m gamma)``, broadcast ``L (alpha + m beta)``,
reduce-then-broadcast all-reduce ``2L (alpha + m beta) + L m gamma``; with ``m`` bytes per block,
gather and scatter ``L alpha + (n - 1) m beta`` (the root moves every other block once).
"""

from __future__ import annotations

from functools import lru_cache

from .cost import log2_ceil
from .schedule import Copy, Recv, Region, Schedule, Send, check_call, without_empty


def _rounds(size: int) -> int:
    return (size - 1).bit_length()


def _span(v: int, size: int) -> int:
    """Blocks in the subtree of virtual rank ``v``."""
    return min(v & -v, size - v) if v else size


def _upward(v: int, size: int) -> list[tuple[int | None, int | None]]:
    """Per upward round: (virtual child that ``v`` receives from, virtual parent it sends to)."""
    plan = []
    for k in range(_rounds(size)):
        bit = 1 << k
        child = v + bit if v % (2 * bit) == 0 and v + bit < size else None
        parent = v - bit if v % (2 * bit) == bit else None
        plan.append((child, parent))
    return plan


def _split(lo: int, hi: int, root: int, size: int, at_root: bool) -> list[tuple[int, int]]:
    """The messages that carry virtual blocks ``[lo, hi)``: two where a message to or from the root
    wraps past real rank ``n - 1`` (the root keeps blocks in real order), else one."""
    first = min(hi - lo, size - (lo + root) % size) if at_root else hi - lo
    return [(lo, lo + first)] + ([(lo + first, hi)] if lo + first < hi else [])


def _placement(v: int, size: int, count: int, root: int, at_root: str, at_leaf: str):
    """``held(lo, hi)``: where virtual rank ``v`` keeps virtual blocks ``[lo, hi)``.

    The root keeps all blocks in real rank order in ``at_root``, a leaf its one block in ``at_leaf``,
    an interior rank its subtree in virtual order in ``tmp``.
    """
    leaf = _span(v, size) == 1

    def held(lo: int, hi: int) -> Region:
        if v == 0:
            start = (lo + root) % size
            return Region(at_root, start * count, (start + hi - lo) * count)
        return Region(at_leaf, 0, count) if leaf else Region("tmp", (lo - v) * count, (hi - v) * count)

    return held


def _reduce_steps(v: int, size: int, count: int, root: int, accumulate_in: str) -> list[list]:
    data, acc = Region("data", 0, count), Region(accumulate_in, 0, count)
    steps, received = [], False
    for child, parent in _upward(v, size):
        ops = []
        if child is not None:
            ops.append(Recv((child + root) % size, acc, reduce=acc if received else data))
            received = True
        if parent is not None:
            ops.append(Send((parent + root) % size, acc if received else data))
        steps.append(ops)
    return steps


def _broadcast_steps(v: int, size: int, count: int, root: int) -> list[list]:
    data = Region("data", 0, count)
    steps = []
    for child, parent in reversed(_upward(v, size)):
        ops = [Recv((parent + root) % size, data)] if parent is not None else []
        if child is not None:
            ops.append(Send((child + root) % size, data))
        steps.append(ops)
    return steps


@lru_cache(maxsize=1024)
def reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Binomial reduce: the root's ``data`` becomes the reduction of every rank's ``data``.

    Non-root ``data`` is never written; interior ranks accumulate in ``tmp`` (``count`` elements).

    Args:
        rank, size, root: this rank, the world size and the rank that gets the result.
        count: elements in the tensor.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, root 0): rank 1 sends ``data``; rank 0 receives it and reduces in place.
    """
    check_call(rank, size, count, root)
    v = (rank - root) % size
    interior = v != 0 and any(child is not None for child, _ in _upward(v, size))
    steps = _reduce_steps(v, size, count, root, "tmp" if interior else "data")
    return Schedule(without_empty(steps), tmp=count if interior else 0)


@lru_cache(maxsize=1024)
def broadcast(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Binomial broadcast: every rank's ``data`` becomes the root's.

    Example (2 ranks, root 1): rank 1 sends ``data``; rank 0 receives it over its own ``data``.
    """
    check_call(rank, size, count, root)
    return Schedule(without_empty(_broadcast_steps((rank - root) % size, size, count, root)))


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """All-reduce as binomial reduce to rank 0 (in place) then binomial broadcast: ``2 ceil(log2 n)`` steps.

    Sends the whole tensor in every step, so it suits scalars and tiny tensors only. ``root`` is
    ignored.

    Example (2 ranks): rank 1 sends ``data`` to rank 0, which reduces it in and sends it back.
    """
    check_call(rank, size, count, root)
    steps = _reduce_steps(rank, size, count, 0, "data") + _broadcast_steps(rank, size, count, 0)
    return Schedule(without_empty(steps))


@lru_cache(maxsize=1024)
def gather(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Binomial gather: the root's ``out`` block ``i`` (``count`` elements) becomes rank ``i``'s ``data``.

    Interior non-root ranks collect their subtree's blocks in ``tmp`` and forward them in one
    message; the root has ``size * count`` elements of ``out``, the others none.

    Example (2 ranks, root 0): rank 0 copies ``data`` to ``out[0:count]`` and receives rank 1's
    ``data`` into ``out[count:2count]``.
    """
    check_call(rank, size, count, root)
    v = (rank - root) % size
    span = _span(v, size)
    held = _placement(v, size, count, root, at_root="out", at_leaf="data")
    steps = [[] for _ in range(max(1, _rounds(size)))]
    if v == 0 or span > 1:
        steps[0].append(Copy(Region("data", 0, count), held(v, v + 1)))
    for ops, (child, parent) in zip(steps, _upward(v, size)):
        if child is not None:
            parts = _split(child, child + _span(child, size), root, size, v == 0)
            ops += [Recv((child + root) % size, held(lo, hi)) for lo, hi in parts]
        if parent is not None:
            parts = _split(v, v + span, root, size, parent == 0)
            ops += [Send((parent + root) % size, held(lo, hi)) for lo, hi in parts]
    return Schedule(without_empty(steps), tmp=span * count if v and span > 1 else 0)


@lru_cache(maxsize=1024)
def scatter(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Binomial scatter: ``out`` on rank ``r`` (``count`` elements) becomes the root's ``data`` block ``r``.

    Only the root's ``data`` (``size * count`` elements) is read. Interior non-root ranks receive
    their subtree's blocks into ``tmp``, forward the children's shares, and copy their own to ``out``.

    Example (2 ranks, root 0): rank 0 sends ``data[count:2count]`` to rank 1 and copies
    ``data[0:count]`` to its own ``out``.
    """
    check_call(rank, size, count, root)
    v = (rank - root) % size
    span = _span(v, size)
    held = _placement(v, size, count, root, at_root="data", at_leaf="out")
    own = Region("out", 0, count)
    steps = [[] for _ in range(max(1, _rounds(size)))]
    if v == 0:
        steps[0].append(Copy(held(0, 1), own))
    for s, (child, parent) in enumerate(reversed(_upward(v, size))):
        if parent is not None:
            parts = _split(v, v + span, root, size, parent == 0)
            steps[s] += [Recv((parent + root) % size, held(lo, hi)) for lo, hi in parts]
            if span > 1:  # children follow, so step s + 1 exists
                steps[s + 1].append(Copy(held(v, v + 1), own))
        if child is not None:
            parts = _split(child, child + _span(child, size), root, size, v == 0)
            steps[s] += [Send((child + root) % size, held(lo, hi)) for lo, hi in parts]
    return Schedule(without_empty(steps), tmp=span * count if v and span > 1 else 0)


def reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`reduce` on ``n`` ranks for ``m`` bytes (see the module docstring)."""
    return log2_ceil(n) * (alpha + m * beta + m * gamma)


def broadcast_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`broadcast` on ``n`` ranks for ``m`` bytes."""
    return log2_ceil(n) * (alpha + m * beta)


def all_reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_reduce` on ``n`` ranks for ``m`` bytes."""
    return log2_ceil(n) * (2 * alpha + 2 * m * beta + m * gamma)


def gather_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`gather` on ``n`` ranks, ``m`` bytes gathered in all (``m / n`` per block)."""
    return log2_ceil(n) * alpha + (n - 1) / n * m * beta


def scatter_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`scatter` on ``n`` ranks, ``m`` bytes scattered in all (``m / n`` per block)."""
    return log2_ceil(n) * alpha + (n - 1) / n * m * beta
