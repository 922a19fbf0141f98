"""Symbolic execution of schedules: every rank's schedule runs together, with no processes, and the
result is checked against what the collective must compute.

Two parts, kept apart so the simulator can reuse the first with a timing model:

- The *walker* (:func:`walk`, :func:`match`) steps all ranks' schedules together and enforces the
  rules that need no data: peers and regions in range; the k-th send from ``p`` to ``q`` in a step
  meets the k-th receive from ``p`` on ``q`` with the same length; and no *hazard* (a receive that
  overwrites what a send of the same step reads, what another receive writes — except two in-place
  reduces into the same region — or what another receive reduces from). Zero-length ops are absent.
  It hands every copy and message to a *model*.
- The *symbolic model* (:class:`Symbolic`) stores, instead of numbers, a record per element: which
  original element index it stands for (``index``, -1 while unwritten) and how many times each rank's
  contribution is in it (``counts[element, rank]``). Reading an unwritten element, or reducing two
  elements with different indices, is an error. It also tracks which ranks each rank has *heard
  from*, directly or through others, which is what a barrier must guarantee.

:func:`verify` builds the schedules from the registry, walks them over the symbolic model and
compares the final records with the collective's contract (``schedule.py`` describes the buffers):
results where the collective defines them, inputs unchanged, every contribution exactly once.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from . import get
from .schedule import BUFFERS, Copy, Recv, Region, Schedule, Send

ALL = None  # owner of a fully reduced element: every rank, once


class ScheduleError(Exception):
    """A schedule breaks the schedule rules or does not compute its collective."""


@dataclass(frozen=True)
class Message:
    """A matched send and receive of one step."""

    src: int
    dst: int
    send: Send
    recv: Recv


class Model(Protocol):
    """What the walker drives: the buffers' contents, symbolic here, timed in the simulator."""

    def copy(self, rank: int, op: Copy) -> None: ...

    def read(self, rank: int, src: Region) -> object: ...

    def receive(self, rank: int, op: Recv, payload: object) -> None: ...


def walk(schedules: list[Schedule], sizes: list[dict[str, int]], model: Model) -> None:
    """Run every rank's schedule together, step by step, over ``model``.

    Args:
        schedules: one schedule per rank, rank ``i`` at index ``i``.
        sizes: per rank, the length of each buffer it has (``data``, ``out``, ``tmp``).
        model: receives each step's copies, then reads every send's payload, then applies every
            receive (so a step's sends see the buffers as they were before its receives).

    Raises:
        ScheduleError: naming the step and rank, for a broken rule or an error the model raises.
    """
    for s in range(max((len(schedule.steps) for schedule in schedules), default=0)):
        steps = []
        for rank, schedule in enumerate(schedules):
            with _context(f"step {s}, rank {rank}"):
                ops = live(schedule.steps[s]) if s < len(schedule.steps) else ()
                check_step(rank, ops, sizes[rank], len(schedules))
                for op in ops:
                    if isinstance(op, Copy):
                        model.copy(rank, op)
            steps.append(ops)
        with _context(f"step {s}"):
            messages = match(steps)
        payloads = []
        for message in messages:
            with _context(f"step {s}, rank {message.src}"):
                payloads.append(model.read(message.src, message.send.src))
        for message, payload in zip(messages, payloads):
            with _context(f"step {s}, rank {message.dst}"):
                model.receive(message.dst, message.recv, payload)


def live(step) -> tuple:
    """The ops of ``step`` that move at least one element (zero-length ops count as absent)."""
    for op in step:
        if not isinstance(op, (Send, Recv, Copy)):
            raise ScheduleError(f"{op!r} is not a Send, Recv or Copy")
    return tuple(op for op in step if (op.dst if isinstance(op, Recv) else op.src).count != 0)


def match(steps: list[tuple]) -> list[Message]:
    """Pair the sends and receives of one step (``steps[rank]`` = that rank's live ops).

    Raises:
        ScheduleError: when a rank pair's sends and receives differ in number or, k-th with k-th,
            in length.
    """
    sends: dict[tuple[int, int], list[Send]] = {}
    recvs: dict[tuple[int, int], list[Recv]] = {}
    for rank, ops in enumerate(steps):
        for op in ops:
            if isinstance(op, Send):
                sends.setdefault((rank, op.peer), []).append(op)
            elif isinstance(op, Recv):
                recvs.setdefault((op.peer, rank), []).append(op)
    messages = []
    for src, dst in sorted(sends.keys() | recvs.keys()):
        out, into = sends.get((src, dst), []), recvs.get((src, dst), [])
        if len(out) != len(into):
            raise ScheduleError(
                f"rank {src} sends {len(out)} message(s) to rank {dst}, which posts {len(into)} receive(s) from it"
            )
        for k, (send, recv) in enumerate(zip(out, into)):
            if send.src.count != recv.dst.count:
                raise ScheduleError(
                    f"message {k} from rank {src} to rank {dst}: sends {_fmt(send.src)} "
                    f"({send.src.count} elements) into {_fmt(recv.dst)} ({recv.dst.count} elements)"
                )
            messages.append(Message(src, dst, send, recv))
    return messages


def check_step(rank: int, ops: tuple, sizes: dict[str, int], world: int) -> None:
    """Check one rank's live ops of one step: peers, bounds, lengths and hazards."""
    for op in ops:
        if isinstance(op, (Send, Recv)) and not (0 <= op.peer < world and op.peer != rank):
            raise ScheduleError(f"names peer {op.peer} in a world of {world}")
        for reg in _regions(op):
            if reg.buf not in BUFFERS or not 0 <= reg.start <= reg.stop <= sizes.get(reg.buf, 0):
                raise ScheduleError(f"{_fmt(reg)} is outside its buffer ({sizes.get(reg.buf, 0)} elements)")
        if isinstance(op, Copy) and not _copy_ok(op):
            raise ScheduleError(f"copy {_fmt(op.src)} -> {_fmt(op.dst)}{_with(op.reduce)} differs in length or "
                                "partly overlaps")
    recvs = [op for op in ops if isinstance(op, Recv)]
    reads = [op.src for op in ops if isinstance(op, Send)]
    for i, a in enumerate(recvs):
        into = f"receive into {_fmt(a.dst)}"
        if a.reduce is not None and (a.reduce.count != a.dst.count or (a.reduce != a.dst and a.reduce.overlaps(a.dst))):
            raise ScheduleError(f"{into} reduces with {_fmt(a.reduce)}, which differs in length or partly overlaps it")
        for src in reads:
            if a.dst.overlaps(src):
                raise ScheduleError(f"{into} overwrites {_fmt(src)}, which a send of the same step reads")
        for j, b in enumerate(recvs):
            if i == j:
                continue
            if b.reduce not in (None, b.dst) and a.dst.overlaps(b.reduce):
                raise ScheduleError(f"{into} overwrites {_fmt(b.reduce)}, which another receive reduces from")
            both_in_place = a.dst == b.dst and a.reduce == a.dst and b.reduce == b.dst
            if i < j and a.dst.overlaps(b.dst) and not both_in_place:
                raise ScheduleError(f"receives into {_fmt(a.dst)} and {_fmt(b.dst)} overlap")


class Symbolic:
    """The symbolic model: per rank and buffer, ``index[element]`` and ``counts[element, rank]``.

    ``buffers[rank][buf]`` is the pair ``(index, counts)``; ``heard[rank]`` is the bit set of ranks whose
    messages have reached ``rank``, directly or through others.
    """

    def __init__(self, buffers: list[dict[str, tuple[np.ndarray, np.ndarray]]]):
        self.buffers = buffers
        self.heard = [1 << rank for rank in range(len(buffers))]

    def read(self, rank: int, src: Region) -> tuple[np.ndarray, np.ndarray, int]:
        index, counts = self._slice(rank, src)
        unwritten = np.flatnonzero(index < 0)
        if unwritten.size:
            raise ScheduleError(f"reads {src.buf}[{src.start + unwritten[0]}], which was never written")
        return index.copy(), counts.copy(), self.heard[rank]

    def copy(self, rank: int, op: Copy) -> None:
        index, counts, _ = self.read(rank, op.src)
        if op.reduce is not None:
            index, counts = self._combined(rank, op.reduce, index, counts, "itself")
        self._store(rank, op.dst, index, counts)

    def receive(self, rank: int, op: Recv, payload: tuple[np.ndarray, np.ndarray, int]) -> None:
        index, counts, heard = payload
        if op.reduce is not None:
            index, counts = self._combined(rank, op.reduce, index, counts, f"rank {op.peer}")
        self._store(rank, op.dst, index, counts)
        self.heard[rank] |= heard

    def _combined(self, rank: int, acc: Region, index: np.ndarray, counts: np.ndarray, source: str):
        """``(index, counts)`` of ``acc`` reduced with the given elements (from ``source``)."""
        acc_index, acc_counts, _ = self.read(rank, acc)
        clash = np.flatnonzero(acc_index != index)
        if clash.size:
            i = clash[0]
            raise ScheduleError(f"reduces element {index[i]} from {source} with element "
                                f"{acc_index[i]} at {acc.buf}[{acc.start + i}]")
        return index, counts + acc_counts

    def _slice(self, rank: int, reg: Region) -> tuple[np.ndarray, np.ndarray]:
        index, counts = self.buffers[rank][reg.buf]
        return index[reg.start:reg.stop], counts[reg.start:reg.stop]

    def _store(self, rank: int, dst: Region, index: np.ndarray, counts: np.ndarray) -> None:
        old_index, old_counts = self._slice(rank, dst)
        old_index[:] = index
        old_counts[:] = counts


def run_schedules(collective: str, schedules: list[Schedule], count: int, root: int = 0) -> Symbolic:
    """Walk hand-made or registry ``schedules`` (one per rank) symbolically; return the final state.

    Raises:
        ScheduleError: when a schedule breaks a rule while running (not yet the result check).
        ValueError: for an unknown collective.
    """
    size = len(schedules)
    start = []
    for rank, schedule in enumerate(schedules):
        data, want = _contract(collective, rank, size, count, root)
        if schedule.tmp < 0:
            raise ScheduleError(f"rank {rank} asks for {schedule.tmp} elements of tmp")
        out = sum(n for n, _, _ in want.get("out", []))
        buffers = {"data": _records(data, size), "out": _records([], size, out),
                   "tmp": _records([], size, schedule.tmp)}
        if collective == "barrier":  # tokens carry no data: the scratch they travel in counts as written
            buffers["tmp"][0][:] = 0
        start.append(buffers)
    state = Symbolic(start)
    walk(schedules, [{buf: len(index) for buf, (index, _) in b.items()} for b in start], state)
    return state


def check_result(collective: str, state: Symbolic, count: int, root: int = 0) -> None:
    """Compare the state left by :func:`run_schedules` with what ``collective`` must compute.

    Raises:
        ScheduleError: naming the first rank and element that is wrong.
    """
    size = len(state.buffers)
    for rank in range(size):
        for buf, segments in _contract(collective, rank, size, count, root)[1].items():
            index, counts = state.buffers[rank][buf]
            want_index, want_counts = _records(segments, size)
            wrong = np.flatnonzero((index != want_index) | (counts != want_counts).any(axis=1))
            if wrong.size:
                i = wrong[0]
                raise ScheduleError(f"rank {rank} ends with {buf}[{i}] = {_describe(index[i], counts[i])}; "
                                    f"want {_describe(want_index[i], want_counts[i])}")
    if collective == "barrier":
        for rank, heard in enumerate(state.heard):
            missing = [r for r in range(size) if not heard >> r & 1]
            if missing:
                raise ScheduleError(f"rank {rank} leaves the barrier without hearing from ranks {missing}")


def run_symbolic(collective: str, name: str, size: int, count: int, root: int = 0, **options) -> Symbolic:
    """Build every rank's schedule of registry entry ``collective``/``name`` and walk them symbolically.

    Returns the final :class:`Symbolic` state. Raises like :func:`verify`, without the result check.
    """
    fn = get(collective, name)
    schedules = [fn(rank, size, count, root=root, **options) for rank in range(size)]
    with _context(_title(f"{collective}/{name}", size, count, root, options)):
        return run_schedules(collective, schedules, count, root)


def verify(collective: str, name: str, size: int, count: int, root: int = 0, **options) -> None:
    """Check registry entry ``collective``/``name`` on ``size`` ranks and ``count`` elements.

    Raises:
        ScheduleError: for a broken schedule rule or a wrong result, naming the case, step, rank and
            element.
        ValueError, TypeError: for an unknown collective, algorithm or option, or bad arguments.

    Example: ``verify("all_reduce", "ring", 2, 4)`` returns ``None``.
    """
    state = run_symbolic(collective, name, size, count, root, **options)
    with _context(_title(f"{collective}/{name}", size, count, root, options)):
        check_result(collective, state, count, root)


def verify_schedules(collective: str, schedules: list[Schedule], count: int, root: int = 0) -> None:
    """Like :func:`verify`, for schedules given directly (one per rank), e.g. hand-made ones."""
    with _context(_title(f"{collective} (given schedules)", len(schedules), count, root, {})):
        check_result(collective, run_schedules(collective, schedules, count, root), count, root)


def _contract(collective: str, rank: int, size: int, count: int, root: int) -> tuple[list, dict[str, list]]:
    """(this rank's initial ``data``, {buffer: what it must hold at the end}) as segments.

    A segment ``(length, first, owner)`` is ``length`` consecutive elements standing for original
    element indices ``first, first + 1, ...`` of ``owner``'s input, or reduced over every rank once
    when ``owner`` is :data:`ALL`. Buffers sizes follow: ``data`` from the input, ``out`` from the end.
    """
    own, whole = [(count, 0, rank)], [(size * count, 0, rank)]
    per_rank = [(count, 0, j) for j in range(size)]
    is_root = rank == root
    contracts = {
        "all_reduce": (own, {"data": [(count, 0, ALL)]}),
        "reduce": (own, {"data": [(count, 0, ALL if is_root else rank)]}),
        "broadcast": (own, {"data": [(count, 0, root)]}),
        "all_gather": (own, {"data": own, "out": per_rank}),
        "reduce_scatter": (whole, {"data": whole, "out": [(count, rank * count, ALL)]}),
        "all_to_all": (whole, {"data": whole, "out": [(count, rank * count, j) for j in range(size)]}),
        "gather": (own, {"data": own, "out": per_rank if is_root else []}),
        "scatter": (whole if is_root else [], {"data": whole if is_root else [], "out": [(count, rank * count, root)]}),
        "barrier": ([], {}),
    }
    if collective not in contracts:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(contracts)}")
    return contracts[collective]


def _records(segments: list, size: int, unwritten: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(index, counts)`` arrays for ``segments`` followed by ``unwritten`` never-written elements."""
    length = sum(n for n, _, _ in segments) + unwritten
    index = np.full(length, -1, dtype=np.int64)
    counts = np.zeros((length, size), dtype=np.int32)
    at = 0
    for n, first, owner in segments:
        index[at:at + n] = np.arange(first, first + n)
        if owner is ALL:
            counts[at:at + n] = 1
        else:
            counts[at:at + n, owner] = 1
        at += n
    return index, counts


def _describe(index: int, counts: np.ndarray) -> str:
    if index < 0:
        return "never written"
    if (counts == 1).all():
        return f"element {index} reduced over every rank once"
    parts = [f"rank {r}" + (f" x{c}" if c != 1 else "") for r, c in enumerate(counts) if c]
    return f"element {index} of " + (", ".join(parts) or "no rank")


def _regions(op) -> list[Region]:
    if isinstance(op, Recv):
        return [op.dst] + ([op.reduce] if op.reduce is not None else [])
    return [op.src] if isinstance(op, Send) else [op.src, op.dst] + ([op.reduce] if op.reduce is not None else [])


def _copy_ok(op: Copy) -> bool:
    """A plain copy's regions have one length and do not overlap; a reducing copy's ``src`` and
    ``reduce`` have ``dst``'s length and are each ``dst`` itself or apart from it."""
    if op.reduce is None:
        return op.src.count == op.dst.count and not op.src.overlaps(op.dst)
    return all(r.count == op.dst.count and (r == op.dst or not r.overlaps(op.dst)) for r in (op.src, op.reduce))


def _with(reg: Region | None) -> str:
    return "" if reg is None else f" (reducing with {_fmt(reg)})"


def _fmt(reg: Region) -> str:
    return f"{reg.buf}[{reg.start}:{reg.stop}]"


def _title(what: str, size: int, count: int, root: int, options: dict) -> str:
    extra = "".join(f", {key}={value}" for key, value in options.items())
    return f"{what} on {size} ranks, count {count}, root {root}{extra}"


@contextmanager
def _context(where: str):
    """Put ``where`` in front of any :class:`ScheduleError` raised inside."""
    try:
        yield
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}") from None
