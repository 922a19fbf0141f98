"""The state a group's call passes through: claimed, numbered, begun, freed.

One type, written once for both engines: the compiled one is ``allreduce.native._line_plans.CallState``
(``native/callstate.c``), which the compiled shortcut drives directly; :class:`CallState` here is its
pure-Python twin, field for field and method for method, for a group whose lines run in Python
(``ALLREDUCE_ENGINE=python``, or no compiled engine). The runtime reads and writes the fields with the
group's lock held: ``runtime/life.py`` keeps ``usable``, ``runtime/claims.py`` ``issuer`` and
``conflict``, ``runtime/queue.py`` ``busy`` and ``queued``, ``runtime/health.py`` publishes ``started``,
and the group numbers its calls (``issued``) and names its progress thread (``progress``). No C source
reads the runtime's objects by attribute name: the compiled shortcut has this struct.
"""

from __future__ import annotations

from typing import Any, Protocol
from collections.abc import Callable

from .. import native
from ..settings import Settings


class CallStateLike(Protocol):
    """What both twins offer (see the module docstring)."""

    usable: bool  # a call may be issued: not destroyed, not broken, not a fork() child's
    busy: bool  # a call runs, inline or on the progress thread
    queued: int  # calls waiting for the progress thread
    issued: int  # calls numbered so far: the last one's sequence number
    issuer: int  # the thread whose calls are in flight (0: none yet)
    progress: int  # the group's progress thread, which runs Work callbacks (0: none)
    conflict: RuntimeError | None  # the error of a call from a second thread: the calls in flight fail
    started: tuple[int, Any] | None  # (seq, call) of the call begun last, which the heartbeat publishes

    def idle_claim(self, me: int) -> int:
        """Claim the idle, usable group for thread ``me`` and number the call: its sequence number, or
        0 where the general path must decide (busy, work queued, or ``me`` is the progress thread)."""

    def number(self) -> int:
        """Number the call being issued: its sequence number."""

    def begin(self, seq: int, call: Any) -> None:
        """Call ``seq`` of ``call`` began."""

    def free(self) -> bool:
        """The running call is over: the group is free; whether work is queued for the progress thread."""


class CallState:
    """The pure-Python twin of the compiled ``CallState`` (see the module docstring)."""

    __slots__ = ("usable", "busy", "queued", "issued", "issuer", "progress", "conflict", "started", "acquire",
                 "release")

    def __init__(self, acquire: Callable[..., bool], release: Callable[[], None]):
        self.usable = True
        self.busy = False
        self.queued = 0
        self.issued = 0
        self.issuer = 0
        self.progress = 0
        self.conflict: RuntimeError | None = None
        self.started: tuple[int, Any] | None = None
        self.acquire, self.release = acquire, release  # the group's lock's (the compiled shortcut probes it)

    def idle_claim(self, me: int) -> int:
        if not self.usable or me == self.progress or self.busy or self.queued:
            return 0
        self.busy = True
        self.issuer = me
        self.issued += 1
        return self.issued

    def number(self) -> int:
        self.issued += 1
        return self.issued

    def begin(self, seq: int, call: Any) -> None:
        self.started = (seq, call)

    def free(self) -> bool:
        self.busy = False
        return self.queued != 0


def call_state(settings: Settings, acquire: Callable[..., bool], release: Callable[[], None]) -> CallStateLike:
    """A group's call state: the compiled one where ``settings`` let its lines run compiled, else the twin
    (``acquire`` and ``release``: the group's lock's)."""
    module = native.chosen("line_plans", settings)[0]
    kind = CallState if module is None else module.CallState
    state: CallStateLike = kind(acquire, release)
    return state


def compiled(state: CallStateLike) -> bool:
    """Whether ``state`` is the compiled one (its group's shortcuts may be compiled)."""
    return not isinstance(state, CallState)
