"""The simulator: the registry's own schedules, timed on a modelled network instead of run on a real one.

:func:`simulate` reads a collective's schedules into per-step message arrays (``model/traffic.py``)
and times them (``timing.py``) on a :class:`Network` (``model/network.py``: alpha, beta, duplex and a
per-step cost per class of link, the hosts' NICs, gamma per byte reduced, and cores shared by each
step's busy ranks). Nothing here opens a socket or starts a
thread, so any world size can be predicted on a laptop: algorithms that are the same on every rank up
to a rotation are run on one host's worth of ranks (a *cell*), and pipelines of many chunks are run at
two shorter lengths and extended along the straight line their time follows once the pipeline is full.
``tests/unit/test_sim.py`` checks both abridgements against the full step-by-step run.

An algorithm that cannot run on the layout is refused (:func:`refusal`), never priced: the
shared-memory lines join the ranks of one host, so they have no time on several.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import collectives
from ..algorithms import Algorithm, get
from ..model import traffic
from ..model.network import Link, Network
from ..trace import Trace
from . import timing

__all__ = ["Link", "Network", "Result", "refusal", "simulate"]

PIPELINE_EXACT = 48  # pipelines of more chunks than this are extrapolated
_SHORT = (32, 48)  # the two chunk counts the extrapolation runs


@dataclass(frozen=True)
class Result:
    """One predicted collective."""

    collective: str
    algorithm: str
    size: int  # world size
    nbytes: int  # bytes of the whole buffer, in whole elements
    count: int  # the schedule's count (elements per rank's block for split collectives)
    time: float  # seconds until the last rank finishes
    steps: int  # schedule steps
    messages: int  # messages across the whole world
    method: str  # "full", "cell" (a rotation-invariant part stands for all) or "extrapolated"

    @property
    def algbw(self) -> float:
        """GB/s (1e9 bytes per second): bytes of the buffer over time, as ``allreduce bench`` reports."""
        return self.nbytes / self.time / 1e9 if self.time > 0 else math.inf

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth, comparable with the link speed (GB/s)."""
        return self.algbw * collectives.get(self.collective).bus_factor(self.size)


def simulate(collective: str, algorithm: str, nbytes: int, size: int, network: Network, *, itemsize: int = 4,
             root: int = 0, trace: Trace | None = None, trace_ranks: int = 16, **options) -> Result:
    """Predict one collective of ``nbytes`` (the whole buffer, as in ``allreduce bench``) on ``size`` ranks.

    Args:
        collective, algorithm: a registry entry.
        network: links, costs and the number of hosts.
        itemsize: bytes per element of the dtype.
        root: for rooted collectives.
        trace: when given, receives the spans of the first ``trace_ranks`` simulated ranks (of the
            longer short run when a long pipeline is extrapolated).
        options: schedule options (e.g. ``chunk``).

    Returns:
        A :class:`Result`.

    Raises:
        ValueError, TypeError: unknown collective, algorithm or option, bad sizes, hosts that do not
            divide ``size``, or an algorithm that cannot run on them (:func:`refusal`).

    Example: ``simulate("all_reduce", "ring", 2**20, 4, Network(Link(1e-5, 1e-9), Link(1e-5, 1e-9))).time``
    is about ``6e-5 + 1.5 * 2**20 * 1e-9`` seconds.
    """
    if size < 1:
        raise ValueError(f"world size must be at least 1, got {size}")
    network.ranks_per_host(size)
    if (why := refusal(collective, algorithm, network.hosts)) is not None:
        raise ValueError(why)
    facts = collectives.get(collective)
    count = facts.count_for(nbytes, size, itemsize)
    whole = facts.whole(count, size) * itemsize
    chunk = _chunk_option(get(collective, algorithm), options)
    chunks = -(-count // chunk) if chunk else 0
    if chunks <= PIPELINE_EXACT:
        t = _timed(collective, algorithm, size, count, itemsize, network, root, trace, trace_ranks, options)
        return Result(collective, algorithm, size, whole, count, t.time, t.steps, t.messages, t.method)
    per_chunk = -(-count // chunks)  # the length the chunks really have (the last ones may be shorter)
    t1, t2 = [_timed(collective, algorithm, size, k * per_chunk, itemsize, network, root,
                     trace if k == _SHORT[-1] else None, trace_ranks, {**options, "chunk": per_chunk})
              for k in _SHORT]

    def extend(first: float, second: float) -> float:
        """Along the line through the two short runs, to ``count / per_chunk`` chunks."""
        return first + (count / per_chunk - _SHORT[0]) * (second - first) / (_SHORT[1] - _SHORT[0])

    return Result(collective, algorithm, size, whole, count, extend(t1.time, t2.time),
                  round(extend(t1.steps, t2.steps)), round(extend(t1.messages, t2.messages)), "extrapolated")


def refusal(collective: str, algorithm: str, hosts: int) -> str | None:
    """Why ``algorithm`` cannot run on ``hosts`` hosts, or ``None`` where it can: the shared-memory lines
    (``medium="lines"``) are one host's; across hosts there are none to run on.

    Raises:
        ValueError: unknown collective or algorithm.
    """
    if hosts > 1 and get(collective, algorithm).medium == "lines":
        return (f"{collective} algorithm {algorithm!r} runs on the shared-memory lines, which join the ranks of "
                f"one host: it cannot run across {hosts} hosts")
    return None


@dataclass(frozen=True)
class _Timed:
    time: float
    steps: int
    messages: int
    method: str


def _timed(collective, algorithm, size, count, itemsize, network, root, trace, trace_ranks, options) -> _Timed:
    flow = traffic.extract(collective, algorithm, size, count, itemsize, network.hosts, root, **options)
    hook = _Tracer(flow, trace, trace_ranks) if trace is not None else None
    finish = timing.run(flow, network, hook)
    if hook is not None:
        hook.close(finish)
    return _Timed(float(finish.max(initial=0.0)), flow.steps, flow.messages, "cell" if flow.ranks < size else "full")


def _chunk_option(entry: Algorithm, options: dict) -> int | None:
    """Elements per pipeline chunk when the entry takes a ``chunk`` option, else ``None``."""
    if "chunk" not in entry.options:
        return None
    chunk = options.get("chunk", entry.options["chunk"])
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"pipeline chunk must be a positive number of elements, got {chunk!r}")
    return chunk


class _Tracer:
    """Turns the per-step times of :mod:`.timing` into spans for the first ranks (see :mod:`allreduce.trace`)."""

    def __init__(self, flow: traffic.Traffic, trace: Trace, ranks: int):
        self.flow, self.trace, self.ranks = flow, trace, min(ranks, flow.ranks)
        self.step_ends: list[dict[int, float]] = [{} for _ in range(self.ranks)]  # rank: {step: end}

    def __call__(self, step: int, t0: np.ndarray, end: np.ndarray, done: np.ndarray) -> None:
        f, a = self.flow, self.flow.offsets[step]
        for i in np.flatnonzero((f.src[a:a + len(t0)] < self.ranks) | (f.dst[a:a + len(t0)] < self.ranks)):
            src, dst, sender = int(f.src[a + i]), int(f.dst[a + i]), int(f.sender[a + i])
            nbytes = int(f.nbytes[a + i])
            if src < self.ranks:
                peer = (dst - sender + src) % f.size  # the real receiver of this rank's message
                self.trace.span(src, f"send -> {peer}", f"step {step}", t0[i], end[i], bytes=nbytes)
                self._until(src, step, end[i])
            if dst < self.ranks:
                self.trace.span(dst, f"recv <- {sender}", f"step {step}", t0[i], end[i], bytes=nbytes)
                if done[i] > end[i]:
                    self.trace.span(dst, "reduce", f"step {step}", end[i], done[i], bytes=nbytes)
                self._until(dst, step, done[i])

    def _until(self, rank: int, step: int, time: float) -> None:
        ends = self.step_ends[rank]
        ends[step] = max(ends.get(step, 0.0), float(time))

    def close(self, finish: np.ndarray) -> None:
        """Add each rank's step spans (a step starts where the rank's previous one ended) and its total."""
        for rank, ends in enumerate(self.step_ends):
            begun = 0.0
            for step, end in sorted(ends.items()):
                self.trace.span(rank, "step", f"step {step}", begun, end)
                begun = end
            self.trace.span(rank, "collective", "simulated", 0.0, float(finish[rank]))
