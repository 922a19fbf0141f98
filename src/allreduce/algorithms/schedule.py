"""The vocabulary every algorithm speaks: regions, the three kinds of op, steps and schedules.

A schedule is what one rank does in one collective, as data. It names no socket, thread or clock, so
the same schedule runs on TCP, on shared memory, in the simulator and in the symbolic verifier.

Buffers are named, and a region is a slice of one of them, in elements:

- ``data``: the caller's tensor (all_reduce, reduce, broadcast: the whole thing; all_gather, gather:
  this rank's input block; reduce_scatter, all_to_all, scatter: the ``size * count`` input);
- ``out``: the separate output where a collective has one (all_gather, gather at the root: ``size *
  count``; reduce_scatter, scatter: ``count``; all_to_all: ``size * count``);
- ``tmp``: scratch the schedule asks for (``Schedule.tmp`` elements), e.g. to accumulate a reduce on a
  non-root rank without touching its input.

A step runs in three phases: its copies (plain or reducing), in order; then all its sends and
receives at once (full duplex: a rank may send to and receive from the same peer in one step); then
the step is over when every one of them is. A receive either copies the incoming segment over
``dst`` or combines it: ``dst = reduce (op) incoming``, where ``reduce`` is usually ``dst`` itself
(accumulate in place).

Matching is positional: the k-th send from p to q in step s meets the k-th receive from p on q in
step s, and both must have the same length. The verifier (``verify.py``) checks this for every rank
pair, and that no step reads a region it also overwrites.
"""

from __future__ import annotations

from dataclasses import dataclass

BUFFERS = ("data", "out", "tmp")


@dataclass(frozen=True, slots=True)
class Region:
    """Elements ``[start, stop)`` of buffer ``buf`` (one of :data:`BUFFERS`)."""

    buf: str
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    def overlaps(self, other: Region) -> bool:
        return self.buf == other.buf and self.start < other.stop and other.start < self.stop


@dataclass(frozen=True, slots=True)
class Send:
    """Send the elements of ``src`` to rank ``peer``."""

    peer: int
    src: Region


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive ``dst.count`` elements from ``peer``; copy them over ``dst``, or reduce them in.

    With ``reduce`` set, the result is ``dst = reduce (op) incoming``; ``reduce`` has the same length
    as ``dst`` and is usually ``dst`` itself.
    """

    peer: int
    dst: Region
    reduce: Region | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    """Copy ``src`` over ``dst`` on this rank, before the step's messages; or, with ``reduce`` set,
    combine: ``dst = reduce (op) src``, the accumulator on the left (``reduce`` and ``src`` may each be
    ``dst`` itself, but neither may partly overlap it).

    Reducing copies are how a schedule fixes the order of a reduction (``ordered.py``).
    """

    src: Region
    dst: Region
    reduce: Region | None = None


Op = Send | Recv | Copy
Step = tuple  # tuple[Op, ...]


@dataclass(frozen=True)
class Schedule:
    """Everything one rank does in one collective."""

    steps: tuple  # tuple[Step, ...]; step s of every rank happens "together"
    tmp: int = 0  # elements of scratch buffer ``tmp`` this rank needs

    def sends(self):
        """Every send of the schedule, with its step index (for the simulator and cost checks)."""
        return [(s, op) for s, step in enumerate(self.steps) for op in step if isinstance(op, Send)]

    def bytes_sent(self, itemsize: int) -> int:
        return sum(op.src.count for _, op in self.sends()) * itemsize


def chunk_bounds(count: int, parts: int) -> list[int]:
    """Boundaries that split ``count`` elements into ``parts`` near-equal chunks (sizes differ by ≤ 1).

    Chunk ``i`` is ``[b[i], b[i + 1])``; chunks are empty when ``count < parts``.
    """
    return [i * count // parts for i in range(parts + 1)]


def block(buf: str, count: int, i: int) -> Region:
    """Block ``i`` of ``buf`` when every rank's block holds ``count`` elements (all_gather, reduce_scatter...)."""
    return Region(buf, i * count, (i + 1) * count)


def region(buf: str, bounds: list[int], i: int) -> Region:
    """Chunk ``i`` of ``buf`` under ``bounds`` (from :func:`chunk_bounds`)."""
    return Region(buf, bounds[i], bounds[i + 1])


def without_empty(steps) -> tuple:
    """Drop zero-length sends/receives/copies but keep every step, so step indices stay aligned.

    (Written for speed: the simulator builds schedules for tens of thousands of ranks.)
    """
    return tuple(tuple([op for op in step if (r := op.dst if type(op) is Recv else op.src).stop != r.start])
                 for step in steps)


def check_call(rank: int, size: int, count: int, root: int = 0) -> None:
    """Raise ``ValueError`` unless ``0 <= rank < size``, ``0 <= root < size`` and ``count >= 0``."""
    if size < 1:
        raise ValueError(f"world size must be at least 1, got {size}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside a world of size {size}")
    if not 0 <= root < size:
        raise ValueError(f"root {root} is outside a world of size {size}")
    if count < 0:
        raise ValueError(f"count must be at least 0 elements, got {count}")


def pipeline_bounds(count: int, chunk: int) -> list[int]:
    """Boundaries that cut ``count`` elements into near-equal pipeline chunks of at most ``chunk``.

    There are ``ceil(count / chunk)`` chunks (none when ``count`` is 0); ``ValueError`` if ``chunk < 1``.
    """
    if chunk < 1:
        raise ValueError(f"pipeline chunk must be at least 1 element, got {chunk}")
    return chunk_bounds(count, -(-count // chunk)) if count else [0]
