"""How a rank waits when nothing moved: spin, then yield, then sleep until a peer wakes it.

Its own file because this is a policy about CPUs, not about the protocol. Spinning only pays while
every rank has a core: there is none when ranks outnumber cores, and neither spinning nor yielding
while other work keeps the cores busy (the load average is above the core count), because a waiting
rank would then only delay the peer it waits for. Before sleeping a rank raises its *sleeping* flag
and looks once more, so a peer that posts after the look sees the flag and wakes it at once. Every
wait keeps the deadline and looks at the peers every ``check_s``.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable

from ...errors import CommTimeout, with_peer
from .dataplane import In
from .layout import SLEEPING
from .options import ShmOptions
from .link import ShmLink


class Stretch:
    """One stretch of waiting without progress."""

    __slots__ = ("start", "quiet", "checked", "armed")

    def __init__(self):
        self.start = self.quiet = self.checked = time.monotonic()
        self.armed = False  # our sleeping flag is raised


class Waiting:
    """The waiting policy of one rank, and the descriptors it sleeps on: its peers' sockets and pidfds."""

    def __init__(self, options: ShmOptions, words: memoryview, peers: dict[int, ShmLink]):
        self.options = options
        self._words = words  # our control segment, for the sleeping flag
        self._cores = len(os.sched_getaffinity(0))
        self.crowded = len(peers) + 1 > self._cores  # our own ranks outnumber the cores
        self._load = 0.0  # the load average, read at most once a second
        self._load_read = -1.0
        self._poller = select.poll()
        self._polled: dict[int, ShmLink] = {}  # descriptor -> the peer whose socket or pidfd it is
        for peer in peers.values():
            for fd in (peer.sock.fileno(), peer.pidfd):
                if fd is not None:
                    self._poller.register(fd, select.POLLIN)
                    self._polled[fd] = peer

    def pause(self, stretch: Stretch, pending: list, deadline: float, idle: Callable[[], None] | None,
              idle_every: float, check: Callable[[list], None]) -> None:
        """Nothing moved: spin, yield or sleep, and keep the deadline, the idle hook and ``check(pending)``
        (which raises for a peer that is gone)."""
        now = time.monotonic()
        if now >= deadline:
            raise _timed_out(pending)
        if idle is not None and now - stretch.quiet >= idle_every:
            idle()
            stretch.quiet = now
        elapsed = now - stretch.start
        busy = self.busy(now)
        if elapsed < self.options.spin_s and not (self.crowded or busy):
            return
        if now - stretch.checked >= self.options.check_s:
            stretch.checked = now
            check(pending)
        if elapsed < self.options.yield_s and not busy:
            os.sched_yield()
            return
        if not stretch.armed:  # raise the flag, then look once more before sleeping: no lost wake-up
            self._words[SLEEPING] = 1
            stretch.armed = True
            return
        ms = max(0, min(self.options.sleep_ms, int((deadline - now) * 1000) + 1, int(idle_every * 1000) + 1))
        events = self._poller.poll(ms)
        self.moved(stretch)
        for fd, _ in events:
            peer = self._polled.get(fd)
            if peer is None:  # forgotten by a peer check a moment ago
                continue
            if fd == peer.pidfd:
                peer.exited = True
            else:
                peer.drain()
            if peer.exited or peer.hung_up:
                check(pending)

    def busy(self, now: float, own: int = 0) -> bool:
        """Whether other work keeps the cores busy: the load average above the core count plus ``own``
        (the runnable processes the caller counts as its own; read at most once a second; ``now`` is
        ``time.monotonic()``)."""
        if now - self._load_read >= 1.0:
            self._load_read = now
            self._load = os.getloadavg()[0]
        return self._load > self._cores + own

    def moved(self, stretch: Stretch) -> None:
        """The stretch is over (progress, or a sleep ended): lower our sleeping flag if it is raised."""
        if stretch.armed:
            self._words[SLEEPING] = 0
            stretch.armed = False

    def forget(self, peer: ShmLink) -> None:
        """Stop polling a gone peer's descriptors (they would stay readable forever)."""
        for fd in (peer.sock.fileno(), peer.pidfd):
            if self._polled.pop(fd, None) is not None:
                self._poller.unregister(fd)


def _timed_out(pending: list) -> CommTimeout:
    """The timeout for ``pending`` ops, naming the peer of the first unfinished receive (or send)."""
    waiting = [op for op in pending if not op.done]
    ins = [op for op in waiting if type(op) is In]
    op = (ins or waiting)[0]
    what = "waiting for" if ins else "waiting to send to"
    return with_peer(CommTimeout(f"{what} rank {op.peer.rank}"), op.peer.rank)
