"""Who moves the bytes of point-to-point, and when: the threads and polls of a messenger.

A thread that waits (``P2PWork.wait``, a blocking probe, ``Waitany``) *drives*: it polls the links
itself and handles what arrives until its operation is done, so a message that arrives wakes the very
thread that waits for it, with no hand-off. While the cores are not busy it looks again for
:data:`SPIN_S`, then yielding the core until :data:`YIELD_S`, before it sleeps, as the shared-memory
transport does. A thread that only asks (a test: ``is_completed``, MPI's ``Test*``; a non-blocking
probe) *looks*: one poll that does not wait, with everything it finds handled and what can be sent
sent, so that a loop of tests moves the messages itself, as MPI's tests do, and keeps answering its
peers (credit, CLEAR), whatever the other threads of its process are doing.

While nobody waits, a background thread polls instead, so that messages keep moving while the program
computes (announced payloads cleared, eager ones taken off the sockets, credit returned). It steps
aside while any thread drives and comes back :data:`GRACE_S` after the last one stopped (noticed
within :data:`STANDBY_S`: waking it would cost a thread switch per message), or at once when bytes
wait for the socket. Looks do not make it step aside.

Every poller polls the links' sockets, the listener and a :class:`.bell.Bell` of its own, which the
others ring when what it must watch changed (a link came or went, a queue waits for the socket) or,
for a driver, when they took the frame that finished its operation; a wake-up is never taken by a
poller it was not meant for (:class:`.bell.Bells`). Everything they read or write happens under the
ledger's lock. Links are made by helper threads, one per dial or accepted connection, since a
handshake blocks (:mod:`.connections`).
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from ..errors import AllreduceError, Interrupted, PeerLost, with_peer
from .bell import Bell, Bells
from .connections import Connections
from .ledger import Ledger
from .link import MessageLink

GRACE_S = 0.002  # seconds after the last waiting thread stops before the background thread polls again
STANDBY_S = 0.01  # seconds between the background thread's looks while threads drive (nobody wakes it)
SPIN_S = 50e-6  # seconds a waiting thread looks again at once before it sleeps in poll, while cores are idle
YIELD_S = 300e-6  # then until when it looks again, yielding the core in between (a MiB takes ~0.2 ms to copy)
POLL_CAP_S = 1.0  # the longest a poll sleeps before looking again

Watched = dict[int, tuple[MessageLink | None, int]]  # fd -> (its link, or None for the listener and a bell; events)


class Poller:
    """The background thread of a messenger, and the drives of the threads that wait; see the module
    docstring."""

    def __init__(self, ledger: Ledger, bells: Bells, connections: Connections):
        self._ledger, self._bells, self._connections = ledger, bells, connections
        self._drivers = 0  # drives in progress (one more for a drive from a callback its thread runs while driving)
        self._idle_after = 0.0  # the background thread polls again from then (unless its bell rang)
        self._cores = len(os.sched_getaffinity(0))
        self._idle_cores, self._load_checked = False, -1.0  # whether waiting threads may spin (see _spinning)
        self._bell = Bell()  # the background thread's
        self._thread = threading.Thread(target=self._loop, name=f"allreduce-{ledger.name}-p2p", daemon=True)
        with ledger.cv:
            self._thread.start()
            self.ident = self._thread.ident
            bells.of[self.ident] = self._bell

    def _spinning(self) -> bool:
        """Whether a waiting thread may spin: only while the load average is below the core count (else it
        would only delay the peer it waits for); looked at once a second."""
        now = time.monotonic()
        if now - self._load_checked >= 1.0:
            self._load_checked = now
            self._idle_cores = os.getloadavg()[0] < self._cores
        return self._idle_cores

    # ---- who polls -------------------------------------------------------------------------------

    def drive(self, done: Callable[[], bool], deadline: float | None) -> bool:
        """Progress the links from this thread until ``done()`` (checked under the lock) or ``deadline``
        (a ``time.monotonic()`` value); return ``done()``. The links are looked at once at least, even
        past the deadline; ``deadline=None`` is such a look alone, which waits for nothing (a test)."""
        ledger, bells = self._ledger, self._bells
        me, waits = threading.get_ident(), deadline is not None
        with ledger.cv:
            if done() or ledger.closed:
                return done()
            bell = bells.of.get(me)
            own = bell is None  # else this thread polls already: it drives from a callback it runs
            if own:
                bell = bells.of[me] = Bell()
            if waits:
                self._drivers += 1
                outer = bells.waiters.get(me)
                bells.waiters[me] = done
        try:
            while True:
                with ledger.cv:
                    if ledger.closed:
                        return done()
                    watched = self._watched(bell)
                    orphans = self._connections.orphans()
                    left = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
                    wait = min(left, POLL_CAP_S, POLL_CAP_S if orphans is None else orphans)
                events = self._poll(watched, wait)
                with ledger.cv:
                    try:
                        self._handle(events, watched, bell)
                    except BaseException as exc:  # cut short mid-frame: the links' state cannot be trusted
                        ledger.fail(Interrupted(f"{ledger.who}: point-to-point progress was "
                                                f"interrupted by {type(exc).__name__}"))
                        raise
                    if _took(events, bell):
                        bells.ring_done()
                    settled = ledger.settle()
                    finished = done()
                    over = finished or not waits or time.monotonic() >= deadline
                ledger.resolve(settled)
                if over:
                    return finished
        finally:
            with ledger.cv:
                if waits:
                    self._drivers -= 1
                    if outer is None:
                        del bells.waiters[me]
                    else:
                        bells.waiters[me] = outer
                    self._idle_after = time.monotonic() + GRACE_S
                if own:
                    del bells.of[me]
                    bell.close()
                if ledger.closed:
                    ledger.cv.notify_all()  # close() waits for the pollers to leave
                elif any(link.out for link in self._connections.links()):
                    bells.wake()  # bytes still to send: the others (the background thread at once) watch for room

    def _poll(self, watched: Watched, wait: float) -> list:
        """Poll ``watched`` for up to ``wait`` seconds; while the cores are idle, looking again at once for a
        moment first (a reply often comes within microseconds)."""
        poller = select.poll()
        for fd, (_, mask) in watched.items():
            poller.register(fd, mask)
        events = poller.poll(0)
        if events or wait <= 0:
            return events
        if self._spinning():
            start, until = time.perf_counter(), min(YIELD_S, wait)
            while not events and (spun := time.perf_counter() - start) < until:
                if spun > SPIN_S:
                    os.sched_yield()
                events = poller.poll(0)
        return events or poller.poll(wait * 1000.0)

    def _loop(self) -> None:
        """The background thread: poll while no thread drives."""
        ledger, bells, connections = self._ledger, self._bells, self._connections
        poller = select.poll()
        registered: dict[int, int] = {}
        bell, wait = self._bell, None
        while True:
            with ledger.cv:
                while not ledger.closed and (self._drivers or (not bell.rung and time.monotonic() < self._idle_after)):
                    ledger.cv.wait(STANDBY_S if self._drivers else max(0.0, self._idle_after - time.monotonic()))
                if ledger.closed:
                    return
                connections.close_dead()
                watched = self._watched(bell)
                for fd in [fd for fd in registered if fd not in watched]:
                    poller.unregister(fd)
                    del registered[fd]
                for fd, (_, mask) in watched.items():
                    if registered.get(fd) != mask:
                        poller.register(fd, mask)  # registering again modifies
                        registered[fd] = mask
            events = poller.poll(None if wait is None else wait * 1000.0)
            with ledger.cv:
                self._handle(events, watched, bell)
                if _took(events, bell):
                    # a thread began to drive while this one polled, and may sleep in its own poll on the
                    # bytes this just took off the socket (the frame that finishes its operation)
                    bells.ring_done()
                if self._drivers and any(link.out for link in connections.links()):
                    bells.wake()  # this thread steps aside now: the drivers watch for room for what it queued
                wait = connections.orphans()
                settled = ledger.settle()
            ledger.resolve(settled)

    def _watched(self, bell: Bell) -> Watched:
        """What the poller of ``bell`` polls now."""
        watched: Watched = {} if bell.fd is None else {bell.fd: (None, select.POLLIN)}
        if self._ledger.failure is None:  # once failed, the listener is shut (see break_links): nothing to accept
            watched[self._connections.listener.fileno()] = (None, select.POLLIN)
        for link in self._connections.links():
            if not link.dead:
                watched[link.fd] = (link, select.POLLIN | (select.POLLOUT if link.out else 0))
        return watched

    def _handle(self, events: list, watched: Watched, bell: Bell) -> None:
        for fd, event in events:
            link = watched.get(fd, (None, 0))[0]
            if fd == bell.fd:
                bell.hush()
            elif link is None:
                self._connections.accept()
            elif not (link.dead or link.closed):
                self._serve(link, event)

    def _serve(self, link: MessageLink, event: int) -> None:
        connections = self._connections
        try:
            if event & select.POLLOUT:
                connections.flush(link)
            if event & (select.POLLIN | select.POLLERR | select.POLLHUP) and not link.dead:
                link.pump(connections.on_header)
                if link.out and not link.dead:
                    connections.flush(link)
        except PeerLost as exc:
            connections.link_lost(link, exc)
        except AllreduceError as exc:  # a mismatch, or a frame that is not ours: the messenger cannot go on
            self._ledger.fail(with_peer(type(exc)(f"{self._ledger.who}: {exc}"), link.peer))

    # ---- closing ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Wait for the background thread and every driver to leave (the ledger is closed: they return at
        once), but the calling thread's own drive, if it closes from a callback it runs."""
        if threading.current_thread() is not self._thread:
            self._thread.join()
        with self._ledger.cv:
            staying = (threading.get_ident(), self.ident)
            while any(ident not in staying for ident in self._bells.of):
                self._ledger.cv.wait(0.1)
        self._bell.close()


def _took(events: list, bell: Bell) -> bool:
    """Whether ``events`` came from a link or the listener, not only the poller's bell."""
    return any(fd != bell.fd for fd, _ in events)
