"""What a collective's schedules put on the network, step by step, as flat numpy arrays.

The registry's schedules are read once and turned into one row per message: sender, receiver, bytes,
whether the receiver reduces it, whether it crosses hosts. Rows are grouped by step (``offsets``), so
the simulator times a whole step with a few vector operations whatever the number of ranks.

*Cells.* Building every rank's schedule costs ``O(n)`` objects per rank, too many for a ring of
thousands of ranks. Registry entries marked ``shift_invariant`` are the same on every rank up to a
rotation (rank ``r``'s schedule is rank 0's with every peer moved by ``r``), and hosts are contiguous
blocks of ``L`` ranks, so rank ``r`` and rank ``r + L`` do the same things at the same times. For
them only a *cell* of ``P`` ranks is built (``P = L``, or 1 on a single host) and every rank ``p``
outside it stands for rank ``p mod P``: its times are the same. Messages are read on the receiving
side, where the cell rank is real, so each message is counted once. The ranks are alike only when
their chunks are, so an entry marked ``one_chunk_per_rank`` is timed with the count (a pipeline's
chunk, and each of its chunks) rounded up to a multiple of the world size (fewer than ``n`` extra
elements a chunk: it matters only for tiny messages, whose time is latency; and as the slowest rank's
piece is the rounded one, the finish is often the same). ``tests/unit/test_sim.py`` checks the cell
against the full run.

Each step is also checked: the sends and the receives must move the same number of elements per
sender and direction, so a schedule whose two sides disagree fails here instead of being timed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..algorithms import Algorithm, get
from ..algorithms.schedule import Copy, Recv, Schedule, Send
from ..algorithms.verify import ScheduleError

@dataclass(frozen=True)
class Traffic:
    """The messages and copies of one collective; message ``i`` belongs to step ``s`` when
    ``offsets[s] <= i < offsets[s + 1]`` (likewise copies with ``copy_offsets``)."""

    size: int  # ranks in the world
    ranks: int  # ranks simulated: the world, or a cell of it
    hosts: int  # hosts in the simulated ranks (at least 1)
    offsets: np.ndarray  # int64, steps + 1
    src: np.ndarray  # int64: sender, as a simulated rank
    dst: np.ndarray  # int64: receiver, as a simulated rank
    sender: np.ndarray  # int64: the sender's real rank (its peer's number in the world)
    nbytes: np.ndarray  # float64
    reduce: np.ndarray  # bool: the receiver combines it into its buffer
    inter: np.ndarray  # bool: sender and receiver are on different hosts
    src_host: np.ndarray  # int64: the sender's host among the simulated hosts
    dst_host: np.ndarray  # int64
    copy_offsets: np.ndarray  # int64, steps + 1
    copy_rank: np.ndarray  # int64: the rank that copies
    copy_bytes: np.ndarray  # float64

    @property
    def steps(self) -> int:
        return len(self.offsets) - 1

    def busy(self) -> np.ndarray:
        """Per step, the most ranks of one host that send, receive or copy in it (a cell of one rank
        stands for the whole host, every rank of which does what it does)."""
        lengths = np.diff(self.offsets) + np.diff(self.copy_offsets)
        if self.ranks == 1:
            return np.where(lengths > 0, self.size, 0)
        steps = np.arange(self.steps)
        step = np.concatenate([np.repeat(steps, np.diff(self.offsets))] * 2 +
                              [np.repeat(steps, np.diff(self.copy_offsets))])
        rank = np.concatenate([self.src, self.dst, self.copy_rank])
        host_of = np.zeros(self.ranks, np.int64)
        host_of[self.src], host_of[self.dst] = self.src_host, self.dst_host
        pairs = np.unique(step * self.ranks + rank)
        counts = np.zeros((self.steps, self.hosts), np.int64)
        np.add.at(counts, (pairs // self.ranks, host_of[pairs % self.ranks]), 1)
        return counts.max(axis=1, initial=0)

    @property
    def messages(self) -> int:
        """Messages in the whole world (a cell stands for ``size / ranks`` copies of itself)."""
        return len(self.src) * self.size // self.ranks


def cell_size(entry: Algorithm, size: int, hosts: int, options: dict) -> int:
    """Ranks that must be simulated: ``size``, or fewer for a ``shift_invariant`` entry run with its
    default options (what it ``needs`` excepted, which :func:`extract` fills in, and any ``chunk``)."""
    if not entry.shift_invariant or options.keys() - {*entry.needs, "chunk"}:
        return size
    return size // hosts if hosts > 1 else 1


def blocks(size: int, hosts: int) -> tuple:
    """The ranks of each host: equal, contiguous blocks, as a schedule's ``hosts`` option takes them."""
    per_host = size // hosts
    return tuple(tuple(range(h * per_host, (h + 1) * per_host)) for h in range(hosts))


def extract(collective: str, name: str, size: int, count: int, itemsize: int, hosts: int = 1,
            root: int = 0, full: bool = False, **options) -> Traffic:
    """The traffic of registry entry ``collective``/``name`` on ``size`` ranks and ``count`` elements.

    Args:
        itemsize: bytes per element.
        hosts: equal, contiguous blocks of ranks; must divide ``size``.
        full: build every rank even where a cell would do (to check the cell).
        options: passed to the schedule function (e.g. ``chunk``); an entry that needs ``hosts`` gets
            the hosts' ranks unless the options say otherwise.

    Raises:
        ValueError, TypeError: as the schedule function, or when ``hosts`` does not divide ``size``.
        ScheduleError: when a step's sends and receives disagree.
    """
    if hosts < 1 or size % hosts:
        raise ValueError(f"{size} ranks cannot be spread evenly over {hosts} hosts")
    entry = get(collective, name)
    supplies = {"hosts": blocks(size, hosts)}  # what an entry may need
    options = {**{need: supplies[need] for need in entry.needs}, **options}
    if entry.trees is not None and not full:
        if size == 1 or count == 0:  # the schedules are empty
            return from_schedules([Schedule(())], 1, itemsize)
        return from_trees(entry.trees(size, count, root=root, **{**entry.options, **options}), size, itemsize, hosts)
    cell = size if full else cell_size(entry, size, hosts, options)
    if cell < size and entry.one_chunk_per_rank:
        count, options = _whole_pieces(entry, size, count, options)
    schedules = [entry(rank, size, count, root=root, **options) for rank in range(cell)]
    try:
        return from_schedules(schedules, size, itemsize, hosts)
    except ScheduleError as exc:
        raise ScheduleError(f"{collective}/{name} on {size} ranks, count {count}: {exc}") from None


def _whole_pieces(entry: Algorithm, size: int, count: int, options: dict) -> tuple[int, dict]:
    """``count`` and the options with every chunk (the one of ``count``, or each of a pipeline's and its
    ``chunk``) rounded up to a multiple of ``size``, so that the ranks' pieces of each are alike."""
    def up(elements: int) -> int:
        return -(-elements // size) * size

    if "chunk" not in entry.options:
        return up(count), options
    chunk = options.get("chunk", entry.options["chunk"])
    return count // chunk * up(chunk) + up(count % chunk), {**options, "chunk": up(chunk)}


def from_schedules(schedules: list, size: int, itemsize: int, hosts: int = 1) -> Traffic:
    """The traffic of the schedules of ranks ``0 .. len(schedules) - 1`` of a world of ``size``: all of
    them, or a cell whose length divides ``size`` (see the module docstring).

    Raises:
        ScheduleError: when a step's sends and receives disagree.
    """
    cell = len(schedules)
    if hosts < 1 or size % hosts or size % cell:
        raise ValueError(f"{size} ranks cannot be spread evenly over {hosts} hosts and cells of {cell}")
    per_host = size // hosts
    cell_hosts = max(1, cell // per_host)
    messages, copies = [], []
    sent: dict = {}  # (step, sender, receiver - sender) -> elements, from the sending side
    received: dict = {}  # the same, from the receiving side
    for rank, schedule in enumerate(schedules):
        for s, step in enumerate(schedule.steps):
            for op in step:
                kind = type(op)
                if kind is Recv:
                    p, count = op.peer, op.dst.count
                    if count:
                        key = (s, p % cell, (rank - p) % size)
                        received[key] = received.get(key, 0) + count
                        messages.append((s, p % cell, rank, p, count * itemsize, op.reduce is not None,
                                         p // per_host != rank // per_host,
                                         p // per_host % cell_hosts, rank // per_host % cell_hosts))
                elif kind is Send:
                    if op.src.count:
                        key = (s, rank, (op.peer - rank) % size)
                        sent[key] = sent.get(key, 0) + op.src.count
                elif kind is Copy:
                    if op.src.count:
                        copies.append((s, rank, op.src.count * itemsize))
                else:
                    raise ScheduleError(f"step {s}, rank {rank}: {op!r} is not a Send, Recv or Copy")
    if sent != received:
        step = min(key[0] for key in sent.keys() | received.keys() if sent.get(key) != received.get(key))
        raise ScheduleError(f"step {step}: sends and receives disagree")
    steps = max((len(schedule.steps) for schedule in schedules), default=0)
    m = _by_step(messages, 9)
    c = _by_step(copies, 3)
    ints = m[:, [1, 2, 3, 7, 8]].astype(np.int64)
    return Traffic(size, cell, cell_hosts, _offsets(m[:, 0], steps),
                   ints[:, 0], ints[:, 1], ints[:, 2], m[:, 4], m[:, 5] != 0, m[:, 6] != 0, ints[:, 3], ints[:, 4],
                   _offsets(c[:, 0], steps), c[:, 1].astype(np.int64), c[:, 2])


def from_trees(trees: list[tuple], size: int, itemsize: int, hosts: int = 1) -> Traffic:
    """The traffic of pipelined trees (``tree.pipeline_steps`` over each, all in the same steps), built
    with array arithmetic instead of schedules: for an edge from a child at depth ``d``, chunk ``k``
    goes up (reduced) in step ``k + top - d`` and comes down in step ``k + top + d - 1``.

    Args:
        trees: ``(parents, depths, bounds)`` per tree, as an entry's ``trees`` gives them.
    """
    per_host = size // hosts
    rows, steps = [], 0
    for parents, depths, bounds in trees:
        parent, depth = np.asarray(parents, np.int64), np.asarray(depths, np.int64)
        top, chunks = int(depth.max()), len(bounds) - 1
        steps = max(steps, chunks + 2 * top - 1)
        child = np.flatnonzero(parent >= 0)
        lengths = np.diff(np.asarray(bounds, np.float64)) * itemsize
        k = np.arange(chunks)
        for src, dst, step, up in ((child, parent[child], top - depth[child], True),
                                   (parent[child], child, top + depth[child] - 1, False)):
            rows.append((np.add.outer(step, k).ravel(), np.repeat(src, chunks), np.repeat(dst, chunks),
                         np.tile(lengths, len(child)), up))
    step = np.concatenate([r[0] for r in rows])
    keep = np.concatenate([r[3] for r in rows]) > 0  # empty chunks send nothing
    order = np.argsort(step[keep], kind="stable")
    src, dst, step = (np.concatenate([r[i] for r in rows])[keep][order] for i in (1, 2, 0))
    nbytes = np.concatenate([r[3] for r in rows])[keep][order]
    reduce = np.concatenate([np.full(len(r[0]), r[4]) for r in rows])[keep][order]
    src_host, dst_host = src // per_host, dst // per_host
    none = np.zeros(0, np.int64)
    return Traffic(size, size, hosts, _offsets(step, steps), src, dst, src, nbytes, reduce, src_host != dst_host,
                   src_host, dst_host, np.zeros(steps + 1, np.int64), none, np.zeros(0))


def _by_step(rows: list[tuple], width: int) -> np.ndarray:
    """``rows`` as a float array, sorted by their first column (the step), keeping the order within one."""
    table = np.array(rows, dtype=np.float64).reshape(-1, width)
    return table[np.argsort(table[:, 0], kind="stable")]


def _offsets(step_of_row: np.ndarray, steps: int) -> np.ndarray:
    """Where each step's rows begin, and the end: ``steps + 1`` offsets."""
    return np.concatenate([[0], np.cumsum(np.bincount(step_of_row.astype(np.int64), minlength=steps))])
