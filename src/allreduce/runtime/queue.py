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
from typing import Callable

from ..work import Work


class Job:
    """One issued call: its group sequence number, its planned call and buffers, what follows it."""

    __slots__ = ("seq", "planned", "buffers", "after", "future")

    def __init__(self, seq: int, planned, buffers: dict, after: Callable[[], None] | None):
        self.seq, self.planned, self.buffers, self.after = seq, planned, buffers, after
        self.future: concurrent.futures.Future | None = None


class WorkQueue:
    """Runs a group's jobs with ``execute(job)``, inline or on its progress thread; ``finished()`` is
    called (with ``lock`` held) after each job, however it ended."""

    def __init__(self, lock: threading.Condition, execute: Callable[[Job], None], finished: Callable[[], None],
                 stopping: threading.Event, name: str, who: str):
        self._cv = lock
        self._execute = execute
        self._finished = finished
        self._stopping = stopping
        self._who = who  # "rank r/n", for the descriptions of Work
        self._jobs: collections.deque[Job] = collections.deque()
        self.busy = False  # a job is running (inline or on the progress thread)
        self.thread = threading.Thread(target=self._loop, name=f"allreduce-{name}-progress", daemon=True)

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits (read with the lock held)."""
        return not self.busy and not self._jobs

    def admit(self, job: Job, async_op: bool) -> bool:
        """With the lock held: ``True`` if ``job`` runs inline now (the group is marked busy), else it is
        queued for the progress thread."""
        if not async_op and not self.busy and not self._jobs:
            self.busy = True
            return True
        job.future = concurrent.futures.Future()
        self._jobs.append(job)
        self._cv.notify_all()
        return False

    def run_inline(self, job: Job) -> None:
        """Run an admitted inline ``job`` in the caller's thread, then free the group."""
        try:
            self._execute(job)
        finally:
            with self._cv:
                self.busy = False
                self._finished()
                if self._jobs:  # wake the progress thread only when it has work
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
                while not self._jobs or self.busy:
                    if self._stopping.is_set() and not self._jobs:
                        return
                    self._cv.wait()
                job = self._jobs.popleft()
                self.busy = True
            try:
                if job.future.set_running_or_notify_cancel():
                    self._execute(job)
                    job.future.set_result(None)
            except BaseException as exc:  # delivered to whoever waits on the work
                job.future.set_exception(exc)
            finally:
                with self._cv:
                    self.busy = False
                    self._finished()
                    self._cv.notify_all()

    def wake(self) -> None:
        """With the lock held: let the progress thread see that the group is stopping."""
        self._cv.notify_all()
