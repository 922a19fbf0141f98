"""The work queue: a group's calls run strictly in the order they are issued.

A synchronous call on an idle group runs right in the caller's thread (no hand-off, the lowest
latency); anything issued while work is queued, and every ``async_op=True`` call, goes through the
group's progress thread, so the caller can compute meanwhile. Whether a call runs inline or queued
changes nothing the peers see: the order is the issue order either way.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Any
from collections.abc import Callable

import numpy as np

from ..engines import Planned
from ..engines.callstate import CallStateLike
from ..work import Work


class Job:
    """One issued call: its group sequence number, its planned call and buffers, what follows it."""

    __slots__ = ("seq", "planned", "buffers", "after", "future")

    def __init__(self, seq: int, planned: Planned, buffers: dict[str, np.ndarray], after: Callable[[], None] | None):
        self.seq, self.planned, self.buffers, self.after = seq, planned, buffers, after
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()


class WorkQueue:
    """Runs a group's jobs with ``execute(seq, planned, buffers, after)``, inline or on its progress
    thread. ``cv`` is a condition on the RLock ``lock``: the inline path takes the lock alone (it is
    the cheaper). It keeps ``calls.busy`` (a job runs, inline or on the progress thread) and
    ``calls.queued`` (the jobs queued) in the group's call state (:mod:`..engines.callstate`)."""

    def __init__(self, lock: threading.RLock, cv: threading.Condition, execute: Callable[..., None],
                 stopping: threading.Event, name: str, who: str, calls: CallStateLike):
        self._lock, self._cv = lock, cv
        self._execute = execute
        self._stopping = stopping
        self._who = who  # "rank r/n", for the descriptions of Work
        self._calls = calls
        self.jobs: collections.deque[Job] = collections.deque()  # queued for the progress thread
        self.thread = threading.Thread(target=self._loop, name=f"allreduce-{name}-progress", daemon=True)

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits (read with the lock held)."""
        return not self._calls.busy and not self.jobs

    def inline(self, async_op: bool) -> bool:
        """With the lock held: ``True`` if a call issued now runs inline (the group is then marked busy)."""
        calls = self._calls
        if not async_op and not calls.busy and not calls.queued:
            calls.busy = True
            return True
        return False

    def put(self, job: Job) -> None:
        """With the lock held: queue ``job`` for the progress thread."""
        self.jobs.append(job)
        self._calls.queued += 1
        self._cv.notify_all()

    def run_inline(self, seq: int, planned: Planned, buffers: dict[str, np.ndarray], after: Callable[[], None] | None,
                   begun: Any = None) -> None:
        """Run a call that :meth:`inline` admitted, in the caller's thread, then free the group.

        ``begun``: what a compiled shortcut's run of the call ended with, which ``execute`` goes on from
        (see :meth:`.group.ProcessGroup.collective`)."""
        try:
            self._execute(seq, planned, buffers, after, begun)
        finally:
            with self._lock:
                if self._calls.free():  # wake the progress thread only when it has work
                    self._cv.notify_all()

    def handed_off(self, job: Job, async_op: bool) -> Work | None:
        """A queued ``job``'s :class:`Work` (``async_op``), else ``None`` once it has run."""
        work = Work(job.future, f"{self._who}: {job.planned.call.collective} #{job.seq}", self.thread.ident)
        if async_op:
            return work
        work.wait()
        return None

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self.jobs or self._calls.busy:
                    if self._stopping.is_set() and not self.jobs:
                        return
                    self._cv.wait()
                job = self.jobs.popleft()
                self._calls.queued -= 1
                self._calls.busy = True
            try:
                if job.future.set_running_or_notify_cancel():
                    self._execute(job.seq, job.planned, job.buffers, job.after)
                    job.future.set_result(None)
            except BaseException as exc:  # delivered to whoever waits on the work
                job.future.set_exception(exc)
            finally:
                with self._cv:
                    self._calls.busy = False
                    self._cv.notify_all()

    def wake(self) -> None:
        """With the lock held: let the progress thread see that the group is stopping."""
        self._cv.notify_all()
