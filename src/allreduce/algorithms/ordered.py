"""Reductions in rank order: all-reduce, reduce-scatter and reduce that return the same bits always.

Vocabulary: the buffer is cut into ``n`` *chunks*, one per rank (near-equal :func:`chunk_bounds` for
all-reduce and reduce, the caller's blocks for reduce-scatter); rank ``r`` *owns* chunk ``r``. Each
rank sends its *contribution* to every other owner's chunk, as the direct algorithm does, but an
owner does not combine contributions as they arrive: it receives each into a *slot* of scratch, and
in the next step *folds* the chunk's ``n`` terms in rank order with reducing copies,
``((x0 op x1) op x2) op ...``. The result is this left fold elementwise, whatever the world size,
transport, timing or algorithm asked for: the deterministic mode (``use_deterministic_algorithms``)
runs these schedules.

- Reduce-scatter: the exchange, then the fold into ``out``.
- All-reduce: the exchange, then the fold into this rank's own chunk and, in the same step, the
  direct all-gather of the folded chunks.
- Reduce: the exchange, then the fold (into ``data`` on the root, into scratch elsewhere) and every
  owner's folded chunk to the root.

Each rank sends and receives the bytes of a ring (``(n-1)/n m`` per phase) in one step per phase, and
needs ``(n-1)/n m`` bytes of scratch for the slots. Folding waits for the whole exchange, so unlike the
ring's or the direct algorithm's, the reduction does not overlap the transfer.

Cost (``m`` bytes, alpha per message, beta per byte, gamma per byte reduced): reduce-scatter
``(n-1) alpha + (n-1)/n m (beta + gamma)``; all-reduce ``2(n-1) alpha + (n-1)/n m (2 beta + gamma)``,
and reduce as all-reduce (the root receives what the all-gather would bring it).
"""

from __future__ import annotations

from functools import lru_cache

from . import direct
from .ring import all_reduce_cost, reduce_scatter_cost  # noqa: F401 - the same bytes as the ring
from .schedule import Copy, Recv, Region, Schedule, Send, block, check_call, chunk_bounds, region, without_empty


def fold(terms: list[Region], acc: Region) -> list[Copy]:
    """Reducing copies that leave ``acc = ((terms[0] op terms[1]) op terms[2]) ...``, in that order.

    ``acc`` may be one of the terms; it is written only once it has been read, the running value
    staying in ``terms[0]`` until then (which must be writable scratch in that case).
    """
    own = terms.index(acc) if acc in terms else 0
    copies, running = [], terms[0]
    for k in range(1, len(terms)):
        into = acc if k >= own else terms[0]
        copies.append(Copy(terms[k], into, reduce=running))
        running = into
    if running != acc:  # a single term
        copies.append(Copy(running, acc))
    return copies


def exchange(rank: int, size: int, mine: Region, chunk_of) -> tuple[list, list[Region]]:
    """The exchange step (each peer's chunk to it, each peer's contribution to ``mine`` into a slot)
    and the fold's terms in rank order (the slots, with ``chunk_of(rank)`` in this rank's place)."""
    ops, terms = [], []
    for peer in range(size):
        if peer == rank:
            terms.append(chunk_of(rank))
            continue
        slot = len(terms) - (peer > rank)
        terms.append(Region("tmp", slot * mine.count, (slot + 1) * mine.count))
        ops += [Send(peer, chunk_of(peer)), Recv(peer, terms[-1])]
    return ops, terms


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """All-reduce of ``count`` elements in place in ``data``, folded in rank order: two steps.

    Takes the arguments of every schedule (``root`` is ignored) and returns this rank's
    :class:`Schedule`, with ``size - 1`` chunks of scratch; ``ValueError`` for a rank, root or count
    out of range.

    Example (2 ranks, 4 elements): rank 1 sends ``data[0:2]`` to rank 0 and receives rank 0's
    ``data[2:4]`` into ``tmp[0:2]``; then ``data[2:4] = tmp[0:2] + data[2:4]`` and the halves are
    swapped.
    """
    check_call(rank, size, count, root)
    bounds = chunk_bounds(count, size)
    mine = region("data", bounds, rank)
    swap, terms = exchange(rank, size, mine, lambda r: region("data", bounds, r))
    peers = direct.turns(rank, size)
    gather = direct.gather(peers, mine, [region("data", bounds, p) for p in peers])
    return Schedule(without_empty([swap, fold(terms, mine) + gather]), tmp=(size - 1) * mine.count)


@lru_cache(maxsize=1024)
def reduce_scatter(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Reduce-scatter in rank order: ``out`` on rank ``r`` = the fold of every rank's ``data`` block ``r``.

    Args:
        count: elements per rank's output block (``data`` holds ``size * count``, never written).

    Example (2 ranks, count 1): rank 1 sends ``data[0]`` to rank 0 and receives rank 0's ``data[1]``
    into ``tmp[0]``; then ``out[0] = tmp[0] + data[1]``.
    """
    check_call(rank, size, count, root)
    out = Region("out", 0, count)
    swap, terms = exchange(rank, size, out, lambda r: block("data", count, r))
    return Schedule(without_empty([swap, fold(terms, out)]), tmp=(size - 1) * count)


@lru_cache(maxsize=1024)
def reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Reduce of ``count`` elements to ``root``'s ``data``, folded in rank order: two steps.

    Every owner folds its chunk (the root in its ``data``, the others in scratch, leaving their
    ``data`` as it was) and sends it to the root in the second step.

    Example (2 ranks, root 0, 4 elements): rank 1 folds ``data[2:4]`` of both ranks into
    ``tmp[2:4]`` and sends it to rank 0, which folds ``data[0:2]`` in place.
    """
    check_call(rank, size, count, root)
    bounds = chunk_bounds(count, size)
    chunk = region("data", bounds, rank)
    slots = (size - 1) * chunk.count
    acc = chunk if rank == root else Region("tmp", slots, slots + chunk.count)
    swap, terms = exchange(rank, size, chunk, lambda r: region("data", bounds, r))
    if rank == root:
        collect = [Recv(p, region("data", bounds, p)) for p in range(size) if p != root]
    else:
        collect = [Send(root, acc)]
    return Schedule(without_empty([swap, fold(terms, acc) + collect]),
                    tmp=slots + (0 if rank == root else chunk.count))
