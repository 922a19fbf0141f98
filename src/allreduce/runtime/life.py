"""A group's life as a state machine: open, broken by a failure, closing, closed.

Any communication error breaks a group for good, as in NCCL: every later call raises
:class:`GroupBroken` naming the first failure (:class:`Revoked` if a member revoked it). On a broken
group a survivor may still learn who failed, agree and shrink (over the lifelines, see
:mod:`allreduce.resilience.membership`), and destroy it. Destroying a group lets queued work finish (a failure
met meanwhile is still recorded, so the calls queued behind it fail too), stops its threads, then
closes its links; after that every call raises. The transitions below are the only ones there are;
the group's lock guards them.
"""

from __future__ import annotations

import enum
import threading

from ..engines.callstate import CallStateLike
from ..errors import AllreduceError, GroupBroken, Revoked


class State(enum.Enum):
    OPEN = "open"  # calls run
    BROKEN = "broken"  # a call failed: later calls raise GroupBroken naming the failure
    CLOSING = "closing"  # destroy began: queued calls finish, the threads stop
    CLOSED = "closed"  # links closed: every call raises GroupBroken


ALLOWED = {
    State.OPEN: {State.BROKEN, State.CLOSING},
    State.BROKEN: {State.CLOSING},
    State.CLOSING: {State.CLOSED},
    State.CLOSED: set(),
}


class Life:
    """One group's state, its failure (if any), and an event set once it stops (for its threads to wait on).

    It keeps ``calls.usable`` (the group's call state, :mod:`..engines.callstate`): a call may be issued
    (not destroyed, not broken), as the transitions leave it."""

    def __init__(self, rank: int, size: int, name: str, calls: CallStateLike):
        self.state = State.OPEN
        self.failure: AllreduceError | None = None  # the error that broke the group
        self._calls = calls
        self.stopping = threading.Event()  # set on leaving OPEN/BROKEN for CLOSING
        self.foreign: str | None = None  # why this process may not touch the group: a fork() child's words
        self._who = f"rank {rank}/{size}: process group '{name}'"

    def move(self, to: State) -> None:
        """Take the transition to ``to``; ``RuntimeError`` for one the table does not allow."""
        if to not in ALLOWED[self.state]:
            raise RuntimeError(f"{self._who} cannot go from {self.state.value} to {to.value}")
        self.state = to
        self._calls.usable = to is not State.CLOSED and self.failure is None and self.foreign is None
        if to is State.CLOSING:
            self.stopping.set()

    def fail(self, error: AllreduceError) -> None:
        """Record ``error`` as the failure; an open group is broken by it."""
        self.failure = error
        self._calls.usable = False
        if self.state is State.OPEN:
            self.move(State.BROKEN)

    def disown(self, why: str) -> None:
        """This process is a fork() child of the one that formed the group: every call raises ``why``."""
        self.foreign = why
        self._calls.usable = False

    def check_owner(self) -> None:
        """Raise ``RuntimeError`` in a fork() child, before any lock: the parent may have held it at fork."""
        if self.foreign is not None:
            raise RuntimeError(self.foreign)

    def check(self) -> None:
        """Raise :class:`GroupBroken` if a call cannot be issued now (destroyed, or broken)."""
        if not self._calls.usable:
            raise self.refusal()

    def refusal(self) -> GroupBroken | RuntimeError:
        """Why a call cannot be issued now (destroyed, broken, or formed by the parent of a fork)."""
        if self.foreign is not None:
            return RuntimeError(self.foreign)
        if self.state is State.CLOSED:
            return GroupBroken(f"{self._who} was destroyed")
        return self.broken()

    def broken(self) -> GroupBroken:
        """The error every call after the failure raises (:class:`Revoked` after a revocation)."""
        kind = Revoked if isinstance(self.failure, Revoked) else GroupBroken
        return kind(f"{self._who} is unusable after an earlier failure; destroy it and form a new one. "
                           f"The failure was: {self.failure}")
