"""Who moves the bytes of point-to-point, and when: the threads and polls of the engine.

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
poller it was not meant for. Everything they read or write happens under the engine's lock
(:class:`Progress` is a part of :class:`.engine.Engine`). Links are made by helper threads, one per
dial or accepted connection, since a handshake blocks.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

from ..errors import AllreduceError, GroupBroken, Interrupted, PeerLost, ResourceExhausted, exhausted, with_peer
from ..transport import mesh
from .bell import Bell
from .link import Link

GRACE_S = 0.002  # seconds after the last waiting thread stops before the background thread polls again
STANDBY_S = 0.01  # seconds between the background thread's looks while threads drive (nobody wakes it)
CLOSE_S = 1.0  # seconds a closing engine waits for its peers to see its links close
SPIN_S = 50e-6  # seconds a waiting thread looks again at once before it sleeps in poll, while cores are idle
YIELD_S = 300e-6  # then until when it looks again, yielding the core in between (a MiB takes ~0.2 ms to copy)
POLL_CAP_S = 1.0  # the longest a poll sleeps before looking again
FAILED_S = 0.5  # seconds a failed dial gives the store to say why the peer gave up


class Progress:
    """The polling half of the engine; see the module docstring. Needs the engine's ``_cv``, ``_peers``
    and frame handling (``_on_header``, ``_flush``, ``_link_lost``, ``_orphans``, ``_settle``...)."""

    def _start_progress(self, name: str) -> None:
        self._bells: dict[int, Bell] = {}  # thread ident -> bell of each poller now (the background thread's always)
        self._waiters: dict[int, object] = {}  # thread ident -> done() of each thread driving now
        self._drivers = 0  # drives in progress (one more for a drive from a callback its thread runs while driving)
        self._idle_after = 0.0  # the background thread polls again from then (unless its bell rang)
        self._cores = len(os.sched_getaffinity(0))
        self._idle_cores, self._load_checked = False, -1.0  # whether waiting threads may spin (see _spinning)
        self._bell = Bell()  # the background thread's
        self._thread = threading.Thread(target=self._loop, name=f"allreduce-{name}-p2p", daemon=True)
        with self._cv:
            self._thread.start()
            self.progress_ident = self._thread.ident
            self._bells[self.progress_ident] = self._bell

    def _wake(self) -> None:
        """Make every other poller look again (links came or went, a queue needs the socket); under the lock."""
        if self._closed:  # once closed, the bells may be gone
            return
        me = threading.get_ident()
        for ident, bell in self._bells.items():
            if ident != me:  # this thread polls again anyway, with what it just changed in view
                bell.ring()
        self._cv.notify_all()

    def _ring_done(self) -> None:
        """Wake the other drivers whose operation is done now: this poller took the frame that finished it,
        and they may sleep in their own poll (under the lock)."""
        me = threading.get_ident()
        for ident, done in self._waiters.items():
            if ident != me and done():
                self._bells[ident].ring()

    def _spinning(self) -> bool:
        """Whether a waiting thread may spin: only while the load average is below the core count (else it
        would only delay the peer it waits for); looked at once a second."""
        now = time.monotonic()
        if now - self._load_checked >= 1.0:
            self._load_checked = now
            self._idle_cores = os.getloadavg()[0] < self._cores
        return self._idle_cores

    def _polling(self) -> bool:
        """Whether this thread polls, so it will see what it queues without being woken."""
        return threading.get_ident() in self._bells

    # ---- who polls -------------------------------------------------------------------------------

    def drive(self, done, deadline: float | None) -> bool:
        """Progress the links from this thread until ``done()`` (checked under the lock) or ``deadline``
        (a ``time.monotonic()`` value); return ``done()``. The links are looked at once at least, even
        past the deadline; ``deadline=None`` is such a look alone, which waits for nothing (a test)."""
        me, waits = threading.get_ident(), deadline is not None
        with self._cv:
            if done() or self._closed:
                return done()
            bell = self._bells.get(me)
            own = bell is None  # else this thread polls already: it drives from a callback it runs
            if own:
                bell = self._bells[me] = Bell()
            if waits:
                self._drivers += 1
                outer = self._waiters.get(me)
                self._waiters[me] = done
        try:
            while True:
                with self._cv:
                    if self._closed:
                        return done()
                    watched = self._watched(bell)
                    orphans = self._orphans()
                    left = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
                    wait = min(left, POLL_CAP_S, POLL_CAP_S if orphans is None else orphans)
                events = self._poll(watched, wait)
                with self._cv:
                    try:
                        self._handle(events, watched, bell)
                    except BaseException as exc:  # cut short mid-frame: the links' state cannot be trusted
                        self._fail(Interrupted(f"rank {self.rank}/{self.size}: point-to-point progress was "
                                               f"interrupted by {type(exc).__name__}"))
                        raise
                    if self._took(events, bell):
                        self._ring_done()
                    settled = self._settle()
                    finished = done()
                    over = finished or not waits or time.monotonic() >= deadline
                self._resolve(settled)
                if over:
                    return finished
        finally:
            with self._cv:
                if waits:
                    self._drivers -= 1
                    if outer is None:
                        del self._waiters[me]
                    else:
                        self._waiters[me] = outer
                    self._idle_after = time.monotonic() + GRACE_S
                if own:
                    del self._bells[me]
                    bell.close()
                if self._closed:
                    self._cv.notify_all()  # close() waits for the pollers to leave
                elif any(link.out for link in self._links()):
                    self._wake()  # bytes still to send: the others (the background thread at once) watch for room

    def _poll(self, watched: dict, wait: float) -> list:
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
        poller = select.poll()
        registered: dict[int, int] = {}
        bell, wait = self._bell, None
        while True:
            with self._cv:
                while not self._closed and (self._drivers or (not bell.rung and time.monotonic() < self._idle_after)):
                    self._cv.wait(STANDBY_S if self._drivers else max(0.0, self._idle_after - time.monotonic()))
                if self._closed:
                    return
                self._close_dead()
                watched = self._watched(bell)
                for fd in [fd for fd in registered if fd not in watched]:
                    poller.unregister(fd)
                    del registered[fd]
                for fd, (_, mask) in watched.items():
                    if registered.get(fd) != mask:
                        poller.register(fd, mask)  # registering again modifies
                        registered[fd] = mask
            events = poller.poll(None if wait is None else wait * 1000.0)
            with self._cv:
                self._handle(events, watched, bell)
                if self._took(events, bell):
                    # a thread began to drive while this one polled, and may sleep in its own poll on the
                    # bytes this just took off the socket (the frame that finishes its operation)
                    self._ring_done()
                if self._drivers and any(link.out for link in self._links()):
                    self._wake()  # this thread steps aside now: the drivers watch for room for what it queued
                wait = self._orphans()
                settled = self._settle()
            self._resolve(settled)

    def _watched(self, bell: Bell) -> dict[int, tuple[Link | None, int]]:
        """What the poller of ``bell`` polls now: fd -> (link or ``None``, events)."""
        watched: dict[int, tuple[Link | None, int]] = {} if bell.fd is None else {bell.fd: (None, select.POLLIN)}
        if self._failure is None:  # once failed, the listener is shut (see _abort_all): nothing to accept
            watched[self._listener.fileno()] = (None, select.POLLIN)
        for link in self._links():
            if not link.dead:
                watched[link.fd] = (link, select.POLLIN | (select.POLLOUT if link.out else 0))
        return watched

    @staticmethod
    def _took(events, bell: Bell) -> bool:
        """Whether ``events`` came from a link or the listener, not only the poller's bell."""
        return any(fd != bell.fd for fd, _ in events)

    def _links(self):
        for peer in self._peers.values():
            for link in (peer.out, peer.inn):
                if link is not None and not link.closed:
                    yield link

    def _close_dead(self) -> None:
        """Close the links given up on (background thread only, while no other thread polls their fds)."""
        if len(self._bells) == 1:
            for link in list(self._links()):
                if link.dead:
                    link.close()

    def _handle(self, events, watched, bell: Bell) -> None:
        for fd, event in events:
            link = watched.get(fd, (None, 0))[0]
            if fd == bell.fd:
                bell.hush()
            elif link is None:
                self._accept()
            elif not (link.dead or link.closed):
                self._serve(link, event)

    def _serve(self, link: Link, event: int) -> None:
        try:
            if event & select.POLLOUT:
                self._flush(link)
            if event & (select.POLLIN | select.POLLERR | select.POLLHUP) and not link.dead:
                link.pump(self._on_header)
                if link.out and not link.dead:
                    self._flush(link)
        except PeerLost as exc:
            self._link_lost(link, exc)
        except AllreduceError as exc:  # a mismatch, or a frame that is not ours: the engine cannot go on
            self._fail(with_peer(type(exc)(f"rank {self.rank}/{self.size}: {exc}"), link.peer))

    # ---- links coming --------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError as exc:  # none left (BlockingIOError), closed, or out of descriptors: fail at once
                error = exhausted(exc, f"rank {self.rank}/{self.size}: accepting a point-to-point link")
                if error is not None:
                    self._fail(error)
                return
            threading.Thread(target=self._answer, args=(sock,), name=f"allreduce-{self.name}-p2p-answer",
                             daemon=True).start()

    def _answer(self, sock: socket.socket) -> None:
        """Check an accepted connection (a helper thread), then hand its link to the engine."""
        got = self._peering.answer(sock, time.monotonic() + mesh.STRANGER_S)
        if got is None:
            return
        sender, sock = got
        with self._cv:
            peer = self._peer(sender)
            if self._closed or self._failure is not None or (peer.inn is not None and not peer.inn.dead):
                sock.close()
                return
            peer.inn = Link(sender, sock, dialed=False)
            peer.orphan_at = None
            self._wake()

    def _dial(self, peer) -> None:
        peer.dialing = True
        threading.Thread(target=self._connect, args=(peer.rank,), name=f"allreduce-{self.name}-p2p-dial",
                         daemon=True).start()

    def _connect(self, rank: int) -> None:
        """Dial ``rank`` (a helper thread), then hand the link and what waited for it to the engine."""
        sock, error = None, None
        try:
            sock = mesh.dial(self._peering, self._store, rank, time.monotonic() + self.timeout)
        except ResourceExhausted as exc:  # this rank's own failure, not the peer's
            error = ResourceExhausted(f"rank {self.rank}/{self.size}: {exc}")
        except (AllreduceError, OSError) as exc:
            error = with_peer(PeerLost(f"no point-to-point link to rank {rank}: {exc}{self._reason_of(rank)}"), rank)
        with self._cv:
            peer = self._peer(rank)
            peer.dialing = False
            if isinstance(error, ResourceExhausted):
                self._fail(error)
            elif error is not None:
                self._link_lost(None, error, peer)
            elif self._closed or self._failure is not None:
                sock.close()
            else:
                link = peer.out = Link(rank, sock, dialed=True)
                link.push(self.identity.frame)
                for header, payload, done in peer.backlog:
                    link.push(header, payload, done)
                peer.backlog = []
                self._connected(rank)
                self._flush(link)
                self._wake()
            settled = self._settle()
        self._resolve(settled)

    def _reason_of(self, rank: int) -> str:
        """Why ``rank`` gave up, if it said so in the store (briefly, best effort)."""
        try:
            store = self._store.within(FAILED_S)
            key = f"{mesh.FAILED}/{rank}"
            if store.check([key]):
                return f"; rank {rank} failed: {store.get(key).decode(errors='replace')}"
        except Exception:  # the store may be gone or slow: the error stands without the reason
            pass
        return ""

    # ---- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Fail what is still pending, close every link and stop; once. Peers see the links close after
        everything sent before (this rank waits up to :data:`CLOSE_S` for them to notice)."""
        with self._cv:
            if self._closed:
                return
            for op in sorted(self._pending, key=lambda o: o.number):
                self._finish(op, GroupBroken(f"rank {self.rank}/{self.size}: {op.what} cannot finish: process "
                                             f"group '{self.name}' was destroyed"))
            self._wake()  # then no more: the bells close below
            self._closed = True
            settled = self._settle()
        self._resolve(settled)
        if threading.current_thread() is not self._thread:
            self._thread.join()
        with self._cv:
            # closing from a callback that this thread runs while it drives: do not wait for itself
            staying = (threading.get_ident(), self.progress_ident)
            while any(ident not in staying for ident in self._bells):  # they return at once: their operations failed
                self._cv.wait(0.1)
        links = list(self._links())
        for link in links:
            if not link.dead:
                link.shutdown(socket.SHUT_WR)  # after what is in the kernel: the peer reads it all, then EOF
        _drain([link for link in links if not link.dead], time.monotonic() + CLOSE_S)
        for link in links:
            link.close()
        self._listener.close()
        self._bell.close()


def _drain(links: list[Link], deadline: float) -> None:
    """Read and drop what peers still send until each closes its end: closing with unread bytes would
    reset the connection, and a reset may destroy data the peer has not read yet."""
    open_ = {link.fd: link for link in links}
    poller = select.poll()
    for fd in open_:
        poller.register(fd, select.POLLIN)
    scratch = bytearray(1 << 16)
    while open_ and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000.0):
            try:
                n = open_[fd].sock.recv_into(scratch)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                n = 0
            if not n:
                poller.unregister(fd)
                del open_[fd]
