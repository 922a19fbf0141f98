"""The wake-up of one thread that polls the links: an eventfd it polls beside their sockets.

Every poller (a waiting thread, the background thread) has a bell of its own, so that a wake-up meant
for one is never taken by another. With one pipe shared by all, a waiting thread could drain the byte
that told the background thread to look again at changed links (one just accepted, a queue that needs
the socket), and the background thread slept on in a poll of the old ones, with nothing left to wake it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from .ledger import Ledger

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class Bell:
    """An eventfd that is readable once rung, until :meth:`hush`; used under the ledger's lock."""

    def __init__(self):
        try:
            self.fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError as exc:  # out of descriptors: a bell that never rings, so that the poll it serves
            if exc.errno not in _OUT_OF_DESCRIPTORS:  # (at most POLL_CAP_S long) still reaches the links,
                raise  # whose own accept or dial then fails with the error that names the resource
            self.fd = None
        self.rung = False  # the eventfd is readable: its poller's next poll returns at once

    def ring(self) -> None:
        if self.fd is not None and not self.rung:
            self.rung = True
            os.eventfd_write(self.fd, 1)

    def hush(self) -> None:
        """Its poller woke: readable no more."""
        self.rung = False
        if self.fd is None:
            return
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:  # not rung since the last hush
            pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


class Bells:
    """The bell of every thread that polls now (the background thread's always), and what each thread
    that drives waits for: whom to wake when the links change, and whom when an operation is done.
    Used under the ledger's lock."""

    def __init__(self, ledger: Ledger):
        self._ledger = ledger
        self.of: dict[int, Bell] = {}  # thread ident -> bell of each poller now
        self.waiters: dict[int, Callable[[], bool]] = {}  # thread ident -> done() of each thread driving now

    def wake(self) -> None:
        """Make every other poller look again (links came or went, a queue needs the socket)."""
        if self._ledger.closed:  # once closed, the bells may be gone
            return
        me = threading.get_ident()
        for ident, bell in self.of.items():
            if ident != me:  # this thread polls again anyway, with what it just changed in view
                bell.ring()
        self._ledger.cv.notify_all()

    def ring_done(self) -> None:
        """Wake the other drivers whose operation is done now: this poller took the frame that finished it,
        and they may sleep in their own poll."""
        me = threading.get_ident()
        for ident, done in self.waiters.items():
            if ident != me and done():
                self.of[ident].ring()

    def polling(self) -> bool:
        """Whether this thread polls, so it will see what it queues without being woken."""
        return threading.get_ident() in self.of
