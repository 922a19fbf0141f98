"""The wake-up of one thread that polls the links: an eventfd it polls beside their sockets.

Every poller (a waiting thread, the background thread) has a bell of its own, so that a wake-up meant
for one is never taken by another. With one pipe shared by all, a waiting thread could drain the byte
that told the background thread to look again at changed links (one just accepted, a queue that needs
the socket), and the background thread slept on in a poll of the old ones, with nothing left to wake it.
"""

from __future__ import annotations

import errno
import os

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class Bell:
    """An eventfd that is readable once rung, until :meth:`hush`; used under the engine's lock."""

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
