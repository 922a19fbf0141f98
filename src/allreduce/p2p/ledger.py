"""The operations of one messenger and how they end: pending, finished, settled outside the lock; the
messenger's own life (open, failed, closed, or a fork() child's) and the failure that breaks it.

Every part of the messenger changes operations under the ledger's lock (:attr:`Ledger.cv`); a future
settles only after the lock is let go (:meth:`Ledger.settle`, then :meth:`Ledger.resolve`), so that
its callbacks may call the messenger again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import AllreduceError, GroupBroken
from .records import Op, Send


class Ledger:
    """What is pending, what finished since the lock was taken, and whether the messenger is usable.

    ``on_break(reason)`` is what else breaks with it (the links: ABORT frames with ``reason``, the
    listener shut); ``on_failure(error)`` (the group's) is told outside the lock.
    """

    def __init__(self, rank: int, size: int, name: str, on_break: Callable[[str], None]):
        self.rank, self.size, self.name = rank, size, name
        self.cv = threading.Condition()
        self.on_break = on_break
        self.on_failure: Callable[[AllreduceError], None] | None = None
        self.pending: set[Op] = set()
        self.failure: AllreduceError | None = None
        self.closed = False
        self.foreign: str | None = None  # set in a fork() child: every call raises it (see disown)
        self._resolved: list = []  # (future, error or None) to settle outside the lock
        self._told: AllreduceError | None = None  # a failure to report to on_failure, outside the lock

    @property
    def who(self) -> str:
        return f"rank {self.rank}/{self.size}"

    # ---- life ------------------------------------------------------------------------------------

    def owned(self) -> None:
        """``RuntimeError`` in a fork() child, before the lock, which the parent may have held at fork."""
        if self.foreign is not None:
            raise RuntimeError(self.foreign)

    def check(self) -> None:
        """:class:`GroupBroken` if no operation may start: closed, or failed."""
        if self.closed:
            raise GroupBroken(f"{self.who}: process group '{self.name}' was destroyed")
        if self.failure is not None:
            raise GroupBroken(f"{self.who}: process group '{self.name}' is unusable after an earlier failure; "
                              f"destroy it and form a new one. The failure was: {self.failure}")

    def fail(self, error: AllreduceError, culprit: Op | None = None) -> None:
        """Break the messenger (under the lock): ``culprit`` fails with ``error``, every other pending
        operation with :class:`GroupBroken` naming it; the links break; ``on_failure`` is told."""
        if self.failure is not None:
            if culprit is not None:
                self.finish(culprit, error)
            return
        self.failure = self._told = error
        self._fail_all(f"{type(error).__name__}: {error}", error, culprit)

    def abort(self, reason: str) -> None:
        """The group failed (``reason``): fail every pending operation and the links (under the lock)."""
        if self.failure is None:
            self.failure = GroupBroken(f"{self.who}: process group '{self.name}' failed: {reason}")
            self._fail_all(reason, self.failure, None)

    def _fail_all(self, reason: str, error: AllreduceError, culprit: Op | None) -> None:
        for op in self.in_order():
            if op is culprit:
                self.finish(op, error)
            else:
                self.finish(op, GroupBroken(f"{self.who}: {op.what} cannot finish: point-to-point "
                                            f"on process group '{self.name}' failed: {error}"))
        self.on_break(reason)

    def close(self) -> None:
        """Fail what is pending, as the group is destroyed (under the lock); once."""
        for op in self.in_order():
            self.finish(op, GroupBroken(f"{self.who}: {op.what} cannot finish: process "
                                        f"group '{self.name}' was destroyed"))

    # ---- settling --------------------------------------------------------------------------------

    def in_order(self) -> list[Op]:
        """The pending operations, in the order they were numbered."""
        return sorted(self.pending, key=lambda o: o.number)

    def finish(self, op: Op, error: BaseException | None = None) -> None:
        if op.finished:
            return
        op.finished = True
        if isinstance(op, Send):
            op.finish()
        self.pending.discard(op)
        self._resolved.append((op.future, error))

    def settle(self) -> list:
        """The futures to settle, taken under the lock, after the failure to report, if any: the group
        is broken before a waiter wakes, so that its next call cannot start on a group being aborted."""
        done, self._resolved = self._resolved, []
        told, self._told = self._told, None
        if told is not None:
            done.insert(0, (None, told))
        return done

    def resolve(self, done: list) -> None:
        """Settle futures (their callbacks run here) and report a failure, outside the lock. An exception
        raised meanwhile (a signal handler's) waits until all are settled: a future left unsettled would
        hold its waiter forever."""
        raised = None
        for future, error in done:
            try:
                if future is None:
                    if self.on_failure is not None:
                        self.on_failure(error)
                elif error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
            except BaseException as exc:
                raised = raised or exc
        if raised is not None:
            raise raised
