"""The shared-memory lines as schedules: what the lines engine (``engines/lines.py``) does on them, step for step.

Every rank of a host owns a *line* in shared memory. A *round* is one post (write the payload into
one's line, then the round's number) and one wait (until every peer's line shows that number); peers
then read the payload where it lies. The group runs these entries on the lines themselves where its
transport has them; elsewhere, run by name, the schedule engine runs them over frames.

- One round (``lines``): every rank that writes sends its data to every rank that reads it. An
  all-reduce receives every peer's data into scratch slots and folds the ``n`` terms in rank order,
  ``((x0 op x1) op x2) ...``, by reducing copies (the left fold's bits, those deterministic mode asks
  for); a reduce does so on the root alone; a broadcast's ranks receive the root's data in place; an
  all-gather is the direct one (every block to every rank in one step); a barrier is one token to
  and from every peer.
- In chunks (``chunked_lines``): an all-reduce or reduce cut into chunks of ``chunk`` elements (a
  line's payload); per chunk two rounds, each rank folding its own 1/n slice over every rank's line in
  rank order, then every rank (a reduce: the root) copying the folded slices. That is ``ordered.py``'s
  schedule, chunk after chunk.

Cost (``n`` ranks, ``m`` bytes, ``alpha`` per round: a post and a wait, however many peers; ``beta``
per byte read from a peer's line; ``gamma`` per byte reduced): all-reduce and reduce ``alpha + (n-1)
m (beta + gamma)`` (each reader reads and folds ``n - 1`` payloads); broadcast ``alpha + m beta``;
all-gather ``alpha + (n-1)/n m beta`` (``m`` the gathered buffer); barrier ``alpha``; in chunks of
``c`` bytes, ``2 ceil(m / c) alpha + (n-1)/n m (2 beta + gamma)``. The planner prices them on the
cost profile's ``lines`` link, whose alpha is a round, not the frame transports' per message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from . import ordered
from .schedule import Copy, Recv, Region, Schedule, Send, check_call, without_empty

LINE_BYTES = 1 << 20  # a line's payload in chunks: ShmOptions.line_chunk's default
DEFAULT_CHUNK = LINE_BYTES // 4  # elements per chunk: a line of float32
ONE_ROUND = ("all_reduce", "reduce", "broadcast", "all_gather", "barrier")  # the collectives one round serves
CHUNKED = ("all_reduce", "reduce")  # those the lines take in chunks


@dataclass(frozen=True)
class LineLimits:
    """What a group's lines take (as its transport's ``Lines`` says): the planner's rule for them."""

    at_once: int  # bytes per rank that one round takes (0: none)
    chunked_max: int  # bytes an all-reduce or reduce may have to take them in chunks (0: none)
    capacity: int  # payload bytes of one line

    def chunk(self, itemsize: int) -> int:
        """The ``chunk`` option of ``chunked_lines`` for elements of ``itemsize`` bytes: one line's worth."""
        return self.capacity // itemsize


def _whole(count: int) -> Region:
    return Region("data", 0, count)


def _gathered(rank: int, size: int, count: int) -> tuple[list, list[Region]]:
    """Every rank's data to every peer, the peers' into slots: the step and the fold's terms in rank order."""
    return ordered.exchange(rank, size, _whole(count), lambda _: _whole(count))


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """One round: every rank's data to every peer, then the fold in rank order into ``data``.

    Example (2 ranks, 1 element): each rank sends ``data[0]`` and receives the other's into
    ``tmp[0]``; rank 0 folds ``data = data + tmp``, rank 1 ``data = tmp + data``.
    """
    check_call(rank, size, count, root)
    swap, terms = _gathered(rank, size, count)
    return Schedule(without_empty([swap, ordered.fold(terms, _whole(count))]), tmp=(size - 1) * count)


@lru_cache(maxsize=1024)
def reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """One round: every rank's data to the root, which folds them in rank order; others keep theirs."""
    check_call(rank, size, count, root)
    if rank != root:
        return Schedule(without_empty([[Send(root, _whole(count))]]))
    swap, terms = _gathered(rank, size, count)
    receives = [op for op in swap if isinstance(op, Recv)]
    return Schedule(without_empty([receives, ordered.fold(terms, _whole(count))]), tmp=(size - 1) * count)


@lru_cache(maxsize=1024)
def broadcast(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """One round: the root's data to every other rank, received in place."""
    check_call(rank, size, count, root)
    if rank == root:
        step = [Send(peer, _whole(count)) for peer in range(size) if peer != root]
    else:
        step = [Recv(root, _whole(count))]
    return Schedule(without_empty([step]))


@lru_cache(maxsize=1024)
def barrier(rank: int, size: int, count: int = 0, *, root: int = 0) -> Schedule:
    """One round of nothing but the numbers: a one-element token (``tmp[0]``) to every peer, and
    theirs into slots of their own (zero-length messages count as absent)."""
    check_call(rank, size, count, root)
    peers = [peer for peer in range(size) if peer != rank]
    step = ([Send(peer, Region("tmp", 0, 1)) for peer in peers]
            + [Recv(peer, Region("tmp", 1 + slot, 2 + slot)) for slot, peer in enumerate(peers)])
    return Schedule((tuple(step),) if peers else (), tmp=size if peers else 0)


def _chunked(per_chunk, rank: int, size: int, count: int, root: int, chunk: int) -> Schedule:
    """``per_chunk``'s schedule (``ordered.all_reduce`` or ``ordered.reduce``) on each chunk of a line,
    in order: chunks of ``chunk`` elements from the start, as the lines cut them, the last one shorter."""
    check_call(rank, size, count, root)
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 element, got {chunk}")
    steps, tmp = [], 0
    for low in range(0, count, chunk):
        schedule = per_chunk(rank, size, min(chunk, count - low), root=root)
        regions: dict[Region, Region] = {}  # each region of the chunk moved once, however many ops name it
        steps += [tuple(_moved(op, low, regions) for op in step) for step in schedule.steps]
        tmp = max(tmp, schedule.tmp)
    return Schedule(tuple(steps), tmp=tmp)


def _moved(op, by: int, regions: dict[Region, Region]):
    """``op`` with its regions of ``data`` moved ``by`` elements on (scratch stays where it is);
    ``regions`` remembers the regions already moved, so that ops naming one share its move."""
    def move(r: Region) -> Region:
        if r.buf != "data":
            return r
        if (into := regions.get(r)) is None:
            into = regions[r] = Region("data", r.start + by, r.stop + by)
        return into

    if not by:
        return op
    if type(op) is Send:
        return Send(op.peer, move(op.src))
    if type(op) is Recv:
        return Recv(op.peer, move(op.dst), op.reduce and move(op.reduce))
    return Copy(move(op.src), move(op.dst), op.reduce and move(op.reduce))


@lru_cache(maxsize=1024)
def chunked_all_reduce(rank: int, size: int, count: int, *, root: int = 0, chunk: int = DEFAULT_CHUNK) -> Schedule:
    """All-reduce in chunks of ``chunk`` elements: per chunk the ordered reduce-scatter and all-gather."""
    return _chunked(ordered.all_reduce, rank, size, count, root, chunk)


@lru_cache(maxsize=1024)
def chunked_reduce(rank: int, size: int, count: int, *, root: int = 0, chunk: int = DEFAULT_CHUNK) -> Schedule:
    """Reduce in chunks of ``chunk`` elements: per chunk the ordered reduce-scatter, then the slices to the root."""
    return _chunked(ordered.reduce, rank, size, count, root, chunk)


def _rounds(n: int, alpha: float, rounds: int = 1) -> float:
    """``rounds`` round trips of the lines; none on one rank, which waits for nobody."""
    return rounds * alpha if n > 1 else 0.0


def reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_reduce` or :func:`reduce` (see the module docstring)."""
    return _rounds(n, alpha) + (n - 1) * m * (beta + gamma)


def broadcast_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`broadcast`: every rank reads the root's line once."""
    return _rounds(n, alpha) + (n > 1) * m * beta


def all_gather_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of the one-round all-gather (``direct.all_gather``), ``m`` bytes gathered in all."""
    return _rounds(n, alpha) + (n - 1) / n * m * beta


def barrier_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`barrier` (``m`` is ignored)."""
    return _rounds(n, alpha)


def chunked_cost(n: int, m: float, alpha: float, beta: float, gamma: float,
                 chunk_bytes: float | None = None) -> float:
    """Predicted seconds of :func:`chunked_all_reduce` or :func:`chunked_reduce` in chunks of
    ``chunk_bytes`` (default a line, :data:`LINE_BYTES`: the lines fix the chunk, there is none to pick)."""
    chunks = max(1, math.ceil(m / (chunk_bytes or LINE_BYTES)))
    return _rounds(n, alpha, 2 * chunks) + (n - 1) / n * m * (2 * beta + gamma)
