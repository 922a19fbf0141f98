"""Ring reduce-scatter, ring all-gather, and ring all-reduce (the one followed by the other).

Vocabulary: the ``n`` ranks sit on a ring; every rank sends only to its *right* neighbour ``r + 1``
and receives only from its *left* neighbour ``r - 1`` (mod ``n``). The buffer is cut into ``n``
*chunks*, one per rank (near-equal :func:`chunk_bounds` for all-reduce, the caller's blocks for the
others). In every *step* each link carries exactly one chunk, so all links are busy all the time.

- Reduce-scatter: in step ``s`` (``0 <= s < n - 1``) rank ``r`` sends chunk ``r - s - 1`` and
  receives chunk ``r - s - 2``, which it reduces with its own contribution. Chunk ``c`` starts at
  rank ``c + 1`` and picks up one contribution per hop, so after ``n - 1`` steps rank ``r`` holds
  chunk ``r`` reduced over all ranks.
- All-gather: in step ``s`` rank ``r`` sends chunk ``r - s`` and receives chunk ``r - s - 1``,
  copying it over; chunk ``c`` starts complete at rank ``c`` and reaches everyone in ``n - 1`` hops.

Cost (``m`` bytes in the whole buffer, alpha per message, beta per byte, gamma per byte reduced):
reduce-scatter ``(n-1) alpha + (n-1)/n m beta + (n-1)/n m gamma``; all-gather ``(n-1) alpha +
(n-1)/n m beta``; all-reduce their sum ``2(n-1) alpha + 2(n-1)/n m beta + (n-1)/n m gamma``, which is
bandwidth-optimal: each rank sends ``2(n-1)/n`` of the data.
"""

from __future__ import annotations

from functools import lru_cache

from .schedule import Copy, Recv, Region, Schedule, Send, block, check_call, chunk_bounds, region, without_empty


def _neighbours(rank: int, size: int) -> tuple[int, int]:
    return (rank + 1) % size, (rank - 1) % size


def _reduce_scatter_chunks(rank: int, size: int) -> list[tuple[int, int]]:
    """(chunk sent, chunk received) for each reduce-scatter step."""
    return [((rank - s - 1) % size, (rank - s - 2) % size) for s in range(size - 1)]


def _all_gather_chunks(rank: int, size: int) -> list[tuple[int, int]]:
    """(chunk sent, chunk received) for each all-gather step."""
    return [((rank - s) % size, (rank - s - 1) % size) for s in range(size - 1)]


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Ring all-reduce of ``count`` elements in place in ``data``: ``2(n-1)`` steps.

    Args:
        rank, size: this rank and the world size.
        count: elements in the tensor.
        root: ignored (all-reduce has none); accepted so every schedule takes the same arguments.

    Returns:
        This rank's :class:`Schedule`; no scratch.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, 4 elements): in step 0 rank 0 sends ``data[2:4]`` and reduces rank 1's
    ``data[0:2]`` into its own; in step 1 it sends the finished ``data[0:2]`` and receives the
    finished ``data[2:4]``.
    """
    check_call(rank, size, count, root)
    bounds = chunk_bounds(count, size)
    chunks = [region("data", bounds, i) for i in range(size)]
    right, left = _neighbours(rank, size)
    steps = []
    for out, into in _reduce_scatter_chunks(rank, size):
        steps.append((Send(right, chunks[out]), Recv(left, chunks[into], reduce=chunks[into])))
    for out, into in _all_gather_chunks(rank, size):
        steps.append((Send(right, chunks[out]), Recv(left, chunks[into])))
    return Schedule(without_empty(steps))


@lru_cache(maxsize=1024)
def reduce_scatter(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Ring reduce-scatter: ``out`` on rank ``r`` = reduction of every rank's ``data`` block ``r``.

    ``data`` (``size * count`` elements) is never written: each step reduces the incoming partial
    with this rank's own block into one of two alternating ``tmp`` slots (into ``out`` in the last
    step), and the next step forwards that slot.

    Args:
        count: elements per rank's output block.

    Example (2 ranks, count 1): rank 0 sends ``data[1]`` to rank 1 and receives rank 1's
    ``data[0]``, reducing it with its own ``data[0]`` into ``out[0]``.
    """
    check_call(rank, size, count, root)
    if size == 1:
        return Schedule(without_empty([(Copy(block("data", count, 0), Region("out", 0, count)),)]))
    right, left = _neighbours(rank, size)
    slots = min(2, size - 2)
    last = size - 2
    steps = []
    partial = None  # where the partial this rank forwards next lies (None: its own data block)
    for s, (out, into) in enumerate(_reduce_scatter_chunks(rank, size)):
        src = block("data", count, out) if partial is None else partial
        dst = Region("out", 0, count) if s == last else block("tmp", count, s % slots)
        steps.append((Send(right, src), Recv(left, dst, reduce=block("data", count, into))))
        partial = dst
    return Schedule(without_empty(steps), tmp=slots * count)


@lru_cache(maxsize=1024)
def all_gather(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Ring all-gather: ``out`` block ``i`` (``count`` elements) = rank ``i``'s ``data`` on every rank.

    Step 0 first copies this rank's ``data`` into its own ``out`` block; after that only ``out``
    moves.

    Example (2 ranks, count 1): each rank copies ``data[0]`` to ``out[rank]``, sends it, and
    receives the other rank's element into ``out[1 - rank]``.
    """
    check_call(rank, size, count, root)
    right, left = _neighbours(rank, size)
    steps = [[Copy(Region("data", 0, count), block("out", count, rank))]] + [[] for _ in range(size - 1)]
    for step, (out, into) in zip(steps, _all_gather_chunks(rank, size)):
        step += [Send(right, block("out", count, out)), Recv(left, block("out", count, into))]
    return Schedule(without_empty(steps))


def all_reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_reduce` on ``n`` ranks for ``m`` bytes (see the module docstring)."""
    return 2 * (n - 1) * alpha + (n - 1) / n * m * (2 * beta + gamma)


def reduce_scatter_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`reduce_scatter` on ``n`` ranks, ``m`` bytes of input on each."""
    return (n - 1) * alpha + (n - 1) / n * m * (beta + gamma)


def all_gather_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_gather` on ``n`` ranks, ``m`` bytes gathered in all."""
    return (n - 1) * alpha + (n - 1) / n * m * beta
