"""Handles for collectives started with ``async_op=True`` (torch.distributed's ``Work``)."""

from __future__ import annotations

import concurrent.futures
import threading


class Work:
    """A collective in flight: wait for it, poll it, or chain on its future.

    Example (two ranks)::

        work = dist.all_reduce(x, async_op=True)
        compute_something_else()
        work.wait()          # x now holds the sum on both ranks
    """

    def __init__(self, future: concurrent.futures.Future[None], what: str, completer: int | None = None):
        self._future = future
        self._what = what
        self._completer = completer  # ident of the thread that completes it, which must never wait for it

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the collective is done; re-raise its error. Returns ``True`` like torch.

        Raises ``TimeoutError`` if ``timeout`` seconds pass first (the collective keeps running and
        still fails on its own deadline if a peer never comes), ``RuntimeError`` when called, unfinished,
        from a callback on the thread that would finish it (it would wait forever).
        """
        if threading.get_ident() == self._completer and not self._future.done():
            raise RuntimeError(f"{self._what} waited for from a Work callback, on the group's progress thread "
                               "that must run it: wait for it from the thread that issued it")
        done, _ = concurrent.futures.wait([self._future], timeout)
        if not done:
            raise TimeoutError(f"{self._what} did not complete within {timeout}s")
        self._future.result()  # re-raises the collective's own error, a CommTimeout included
        return True

    def is_completed(self) -> bool:
        """Whether the collective has finished, successfully or not; never blocks."""
        return self._future.done()

    def is_success(self) -> bool:
        """Whether the collective has finished without an error; never blocks."""
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        """The error the collective failed with, ``None`` while running or after success."""
        return self._future.exception() if self._future.done() else None

    def get_future(self) -> concurrent.futures.Future[None]:
        """A ``concurrent.futures.Future`` resolved when the collective completes."""
        return self._future

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "running"
        return f"<Work {self._what} {state}>"
