"""Direct reduce-scatter, all-gather and all-reduce: every rank trades with every other in one step.

Vocabulary: the buffer is cut into ``n`` *chunks*, one per rank (near-equal :func:`chunk_bounds` for
all-reduce, the caller's blocks for the others); rank ``r`` *owns* chunk ``r``. Rank ``r`` meets its
peers in *turns* ``r + 1, r + 2, ..., r + n - 1`` (mod ``n``), so at any moment the ranks read from
different peers rather than all from rank 0.

- Reduce-scatter (one step): rank ``r`` sends chunk ``p`` to every peer ``p`` and reduces the peers'
  chunks ``r`` into its own, in turn order; the order is fixed, so every run gives the same bits.
- All-gather (one step): rank ``r`` sends its chunk to every peer and receives theirs.
- All-reduce: the reduce-scatter, then the all-gather of the reduced chunks (two steps).

These fit shared memory, where a step's messages are read straight out of the senders' memory, all at
once: a collective costs one or two waits however many ranks there are. The ring moves the same bytes
in ``n - 1`` steps per phase.

Cost (``m`` bytes of the whole buffer, alpha per message, beta per byte, gamma per byte reduced; each
rank sends ``n - 1`` messages per step): reduce-scatter ``(n-1) alpha + (n-1)/n m (beta + gamma)``;
all-gather ``(n-1) alpha + (n-1)/n m beta``; all-reduce ``2(n-1) alpha + (n-1)/n m (2 beta + gamma)``,
as the ring, which sends the same messages one per step.
"""

from __future__ import annotations

from functools import lru_cache

from .ring import all_gather_cost, all_reduce_cost, reduce_scatter_cost  # noqa: F401 - the same messages as the ring
from .schedule import Copy, Recv, Region, Schedule, Send, block, check_call, chunk_bounds, region, without_empty


def turns(rank: int, size: int) -> list[int]:
    """The peers of ``rank`` in the order it meets them: ``rank + 1, ..., rank + size - 1`` (mod ``size``)."""
    return [(rank + t) % size for t in range(1, size)]


def scatter_reduce(peers: list[int], chunks: list[Region], mine: Region) -> list:
    """One step: send ``chunks[i]`` to ``peers[i]``; reduce every peer's contribution into ``mine``."""
    return ([Send(peer, chunk) for peer, chunk in zip(peers, chunks)]
            + [Recv(peer, mine, reduce=mine) for peer in peers])


def gather(peers: list[int], mine: Region, chunks: list[Region]) -> list:
    """One step: send ``mine`` to every peer; receive ``chunks[i]`` from ``peers[i]``."""
    return [Send(peer, mine) for peer in peers] + [Recv(peer, chunk) for peer, chunk in zip(peers, chunks)]


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Direct all-reduce of ``count`` elements in place in ``data``: two steps.

    Args:
        rank, size: this rank and the world size.
        count: elements in the tensor.
        root: ignored (all-reduce has none).

    Returns:
        This rank's :class:`Schedule`; no scratch.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, 4 elements): in step 0 rank 0 sends ``data[2:4]`` and reduces rank 1's
    ``data[0:2]`` into its own; in step 1 it sends ``data[0:2]`` and receives ``data[2:4]``.
    """
    check_call(rank, size, count, root)
    bounds = chunk_bounds(count, size)
    peers = turns(rank, size)
    chunks = [region("data", bounds, p) for p in peers]
    mine = region("data", bounds, rank)
    return Schedule(without_empty([scatter_reduce(peers, chunks, mine), gather(peers, mine, chunks)]))


@lru_cache(maxsize=1024)
def reduce_scatter(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Direct reduce-scatter: ``out`` on rank ``r`` = reduction of every rank's ``data`` block ``r``.

    The step first copies this rank's own block into ``out``, then reduces the peers' blocks into it;
    ``data`` is never written.

    Args:
        count: elements per rank's output block (``data`` holds ``size * count``).

    Example (2 ranks, count 1): rank 0 copies ``data[0]`` to ``out[0]``, sends ``data[1]`` to rank 1
    and reduces rank 1's ``data[0]`` into ``out[0]``.
    """
    check_call(rank, size, count, root)
    peers = turns(rank, size)
    out = Region("out", 0, count)
    step = [Copy(block("data", count, rank), out)]
    step += scatter_reduce(peers, [block("data", count, p) for p in peers], out)
    return Schedule(without_empty([step]))


@lru_cache(maxsize=1024)
def all_gather(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Direct all-gather: ``out`` block ``i`` (``count`` elements) = rank ``i``'s ``data`` on every rank.

    Example (2 ranks, count 1): each rank copies ``data[0]`` to ``out[rank]``, sends ``data[0]`` and
    receives the other rank's element into ``out[1 - rank]``.
    """
    check_call(rank, size, count, root)
    peers = turns(rank, size)
    step = [Copy(Region("data", 0, count), block("out", count, rank))]
    step += gather(peers, Region("data", 0, count), [block("out", count, p) for p in peers])
    return Schedule(without_empty([step]))
