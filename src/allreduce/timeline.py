"""``ALLREDUCE_TIMELINE=path.json``: a Chrome trace of every collective, step and message of each rank.

:class:`TimelineTransport` wraps the group's real transport and sees every ``exchange``, which is one
step of one collective; the frame headers name the collective, its sequence number and the step. It
records, per rank, on the lanes of :mod:`allreduce.trace`:

- ``collective``: from the first to the last step of each collective (``all_reduce #7``);
- ``step``: each exchange, from the moment it is posted until every send and receive is done;
- ``send -> q``: each send, for the length of its step (the transport does not say when one send of
  several ends);
- ``recv <- p``: each receive, from the step's start until its last byte arrived (seen through the
  receive's ``progress`` callback, which the wrapper installs or wraps, or its ``absorb`` callback);
- ``reduce``: the time spent in the executor's reduction while the segment was arriving, one span per
  run of reduction calls, with the bytes that had arrived.

Times are the wall clock (microseconds), so the files of ranks on one host line up; each rank writes
its own file when the group closes: ``path.json`` becomes ``path.rank3.json`` (``path.<group>.rank3.json``
for groups other than the default one). :func:`allreduce.trace.merge` joins them, and
``allreduce simulate --timeline`` writes the prediction in the same format.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time

from . import collectives, wire
from .trace import Trace
from .transport.base import Transport

_MERGE_GAP = 20e-6  # seconds: reduction calls closer than this form one span
_MIN_REDUCE = 2e-6  # seconds: calls shorter than this only checked whether a block was ready


def timeline_path(path: str, rank: int, group: str = "default") -> str:
    """The file of ``rank``: ``run.json`` -> ``run.rank3.json`` (``run.<group>.rank3.json``)."""
    stem, ext = os.path.splitext(path)
    tag = "" if group == "default" else "." + re.sub(r"[^\w.-]", "_", group)
    return f"{stem}{tag}.rank{rank}{ext or '.json'}"


class TimelineTransport(Transport):
    """Passes everything to ``inner`` and records a timeline of it; writes the file on close/abort."""

    def __init__(self, inner: Transport, path: str, rank: int, group: str = "default"):
        self.inner = inner
        self.rank, self.size = inner.rank, inner.size
        self.path = timeline_path(path, rank, group)
        self.world_rank = rank
        self.trace = Trace(source="allreduce timeline", rank=rank, group=group)
        self._wall = time.time() - time.perf_counter()  # perf_counter -> wall clock
        self._collective: list | None = None  # [name, start, end] of the collective in progress
        self._written = False

    def exchange(self, sends, recvs, deadline, idle=None, idle_every: float = 1.0) -> None:
        if not sends and not recvs:
            return self.inner.exchange(sends, recvs, deadline, idle, idle_every)
        watched = [_Watched(spec, self._wall) for spec in recvs]
        start = time.perf_counter()
        try:
            self.inner.exchange(sends, [w.spec for w in watched], deadline, idle, idle_every)
        finally:
            self._record((sends or recvs)[0].header, start + self._wall, time.perf_counter() + self._wall,
                         sends, watched, sys.exc_info()[0] is not None)

    def abort(self, reason: str) -> None:
        try:
            self.inner.abort(reason)
        finally:
            self._write()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._write()

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)  # whatever else the transport offers

    def _record(self, header: wire.Header, start: float, end: float, sends, watched, failed: bool) -> None:
        name = f"{collectives.BY_CODE[header.collective].name} #{header.seq}"
        if self._collective is None or self._collective[0] != name:
            self._end_collective()
            self._collective = [name, start, end]
        self._collective[2] = end
        r = self.world_rank
        args = {"failed": True} if failed else {}
        self.trace.span(r, "step", f"step {header.step}", start, end, collective=name, **args)
        for spec in sends:
            self.trace.span(r, f"send -> {spec.peer}", f"step {header.step}", start, end, bytes=spec.payload.nbytes)
        for w in watched:
            last = w.arrived if w.arrived is not None else end
            self.trace.span(r, f"recv <- {w.spec.peer}", f"step {header.step}", start, last, bytes=w.spec.dest.nbytes)
            for begin, finish, nbytes in w.reductions:
                self.trace.span(r, "reduce", f"step {header.step}", begin, finish, arrived=nbytes)

    def _end_collective(self) -> None:
        if self._collective is not None:
            name, start, end = self._collective
            self.trace.span(self.world_rank, "collective", name, start, end)
            self._collective = None

    def _write(self) -> None:
        if self._written:
            return
        self._written = True
        self._end_collective()
        self.trace.write(self.path)


class _Watched:
    """A receive whose callbacks are observed: when bytes arrive, and the time spent reducing them.

    ``progress(nbytes)`` is installed where there was none (it only watches arrivals); an ``absorb``
    callback (a transport handing over bytes in place) is wrapped only where the executor set one,
    since its presence changes what the transport does.
    """

    __slots__ = ("spec", "inner", "inner_absorb", "wall", "arrived", "reductions")

    def __init__(self, spec, wall: float):
        self.inner = spec.progress
        self.inner_absorb = getattr(spec, "absorb", None)
        extra = {"absorb": self._absorb} if self.inner_absorb is not None else {}
        self.spec = dataclasses.replace(spec, progress=self._progress, **extra)
        self.wall = wall
        self.arrived: float | None = None  # wall time of the latest arrival
        self.reductions: list[list] = []  # [start, end, bytes arrived] runs of reduction

    def _progress(self, nbytes: int) -> None:
        self._timed(self.inner, nbytes, nbytes)

    def _absorb(self, view, offset: int) -> None:
        self._timed(self.inner_absorb, offset + len(view), view, offset)

    def _timed(self, fn, nbytes: int, *args) -> None:
        begin = time.perf_counter() + self.wall
        self.arrived = begin
        if fn is None:
            return
        fn(*args)
        finish = time.perf_counter() + self.wall
        if finish - begin < _MIN_REDUCE:
            return
        if self.reductions and begin - self.reductions[-1][1] < _MERGE_GAP:
            self.reductions[-1][1:] = [finish, nbytes]
        else:
            self.reductions.append([begin, finish, nbytes])
