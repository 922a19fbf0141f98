"""TCP transport: one connection per pair of ranks, all progressed by a single poll loop.

Links are set up once, when the group forms (:mod:`.peering`, :mod:`..mesh`). During a collective the
sockets are non-blocking. :meth:`TcpTransport.exchange` pushes header and payload with one ``sendmsg``
(:class:`.link.Link`) and receives straight into the destination memoryview with ``recv_into`` (no
copies), sending and receiving at once so two peers exchanging large segments never deadlock on full
socket buffers. It reads exactly the frames it expects (:class:`ExchangeLink`): data from a peer that
is already a step ahead waits in the kernel until its step comes.

A rank that gives up tells every peer why with an ABORT frame, so that an error anywhere names the
rank that failed first. A frame half sent is finished first (its receiver could not find the ABORT
inside it; it is copied, so the caller's buffer is theirs again at once), and the links close only
once what was queued has been taken by the peer, or after :data:`ABORT_S`: closing with unread data
resets a link and throws away what it had not yet sent. The frames go out at once, as far as the
sockets take them, and what they did not take is sent on a short-lived thread, so the error reaches
the caller without waiting for it; :meth:`TcpTransport.close` (destroying the group) and the
interpreter's exit wait for that thread, so a program that exits on the error still tells its
peers. A rank whose send fails on a reset link reads the ABORT that may wait unread before it
reports the loss.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import deque

from ... import auth, wire
from ...errors import AllreduceError, CommTimeout, ProtocolError
from ...security import Security
from .. import mesh
from ..base import RecvSpec, SendSpec, Transport
from .link import Link
from .peering import TcpPeering
from .wording import aborted, read_abort_reason, stalled, unexpected

_SMALL_FRAME = 1 << 16  # payloads up to this size are read together with their header
_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT
ABORT_S = 0.5  # the most seconds an abort spends getting its frames out before it closes the links
ABORT_STALL_S = 0.25  # ... and the most it waits while no peer takes anything


class ExchangeLink(Link):
    """A link of the collective transport: the frames of one exchange it expects to receive, in order."""

    __slots__ = ("inq", "hdr", "hdr_view", "hdr_got", "got")

    def __init__(self, peer: int, sock: socket.socket):
        super().__init__(peer, sock)
        self.inq: deque[RecvSpec] = deque()
        self.hdr = bytearray(wire.HEADER_SIZE)
        self.hdr_view = memoryview(self.hdr)
        self.hdr_got = 0
        self.got = 0

    def recv_some(self) -> None:
        """Receive until the socket is empty or every expected frame has arrived."""
        while self.inq:
            spec = self.inq[0]
            size = spec.dest.nbytes
            try:
                if self.hdr_got < wire.HEADER_SIZE:
                    if self.hdr_got == 0 and size <= _SMALL_FRAME:  # header and payload in one syscall
                        n = self.sock.recvmsg_into([self.hdr_view, spec.dest])[0]
                        self.got = max(0, n - wire.HEADER_SIZE)
                    else:
                        n = self.sock.recv_into(self.hdr_view[self.hdr_got:])
                    if not n:
                        raise self.lost()
                    self.hdr_got = min(wire.HEADER_SIZE, self.hdr_got + n)
                    if self.hdr_got < wire.HEADER_SIZE:
                        continue
                    self._accept_header(spec)
                    if self.got and spec.progress is not None:
                        spec.progress(self.got)
                while self.got < size:
                    n = self.sock.recv_into(spec.dest[self.got:])
                    if not n:
                        raise self.lost()
                    self.got += n
                    if spec.progress is not None:
                        spec.progress(self.got)
            except BlockingIOError:
                return
            except AllreduceError:
                raise
            except OSError as exc:
                raise self.lost(exc) from exc
            self.inq.popleft()
            self.hdr_got = self.got = 0

    def broken(self, exc: OSError) -> AllreduceError:
        """The error for a link that failed while sending: the peer's ABORT when it sent one before it
        closed (that waits unread here), else the lost link."""
        try:
            self.recv_some()  # frames still expected come first; reading on ends in their ABORT or the close
            head = self.sock.recv(wire.HEADER_SIZE) if self.hdr_got == 0 else b""  # the link is lost: consume
            if len(head) == wire.HEADER_SIZE and wire.decode(head).kind == wire.ABORT:
                return aborted(self.peer, read_abort_reason(self.sock, b"", wire.decode(head).nbytes))
        except AllreduceError as error:
            return error
        except OSError:
            pass
        return self.lost(exc)

    def _accept_header(self, spec: RecvSpec) -> None:
        if self.hdr == wire.encode(spec.header):
            return
        try:
            header = wire.decode(self.hdr)
        except ProtocolError:
            header = None  # worded below
        if header is not None and header.kind == wire.ABORT:
            early = bytes(spec.dest[:min(self.got, header.nbytes)])  # the small-frame read may have taken some
            raise aborted(self.peer, read_abort_reason(self.sock, early, header.nbytes))
        error = unexpected(self.peer, spec.header, bytes(self.hdr))
        if error is not None:
            raise error


class TcpTransport(Transport):
    """Full mesh of TCP links for one group; see the module docstring."""

    def __init__(self, rank: int, size: int, links: dict[int, socket.socket]):
        self.rank = rank
        self.size = size
        self._links = {peer: ExchangeLink(peer, sock) for peer, sock in links.items()}
        self._closing: threading.Thread | None = None  # what abort left to finish sending, then close

    @classmethod
    def connect(cls, rank: int, size: int, store, host: str, tag: str, timeout: float,
                security: Security) -> TcpTransport:
        """Form the mesh (:func:`.mesh.form`) through ``store``: listen on ``host``, connect down, accept up,
        each link proving itself with ``security``.

        Raises ``RendezvousError`` when a peer cannot be reached before ``timeout`` seconds,
        ``PeerLost`` as soon as one is known to have died.
        """
        auth.warn_if_exposed(host, security.key)
        peering = TcpPeering(rank, size, host, tag, security)
        links = mesh.form(peering, store, rank, range(size), time.monotonic() + timeout)
        return cls(rank, size, links)

    def exchange(self, sends: list[SendSpec], recvs: list[RecvSpec], deadline: float,
                 idle=None, idle_every: float = 1.0) -> None:
        busy: dict[int, ExchangeLink] = {}
        for spec in sends:
            link = self._links[spec.peer]
            link.push(memoryview(wire.encode(spec.header)), spec.payload)
            busy[link.fd] = link
        for spec in recvs:
            link = self._links[spec.peer]
            link.inq.append(spec)
            busy[link.fd] = link
        try:
            self._progress(busy, deadline, idle, idle_every)
        except BaseException:
            for link in busy.values():
                link.inq.clear()
            raise

    def _progress(self, busy: dict[int, ExchangeLink], deadline: float, idle, idle_every: float) -> None:
        ready = list(busy.values())
        poller = None
        quiet_since = time.monotonic()
        while True:
            for link in ready:
                if link.out:
                    link.send_some()
                if link.inq:
                    link.recv_some()
                if not (link.out or link.inq):
                    del busy[link.fd]
                    if poller is not None:
                        poller.unregister(link.fd)
            if not busy:
                return
            if poller is None:
                poller = select.poll()
            for fd, link in busy.items():
                mask = (_POLLOUT if link.out else 0) | (_POLLIN if link.inq else 0)
                poller.register(fd, mask)  # re-registering modifies
            now = time.monotonic()
            if now >= deadline:
                raise self._timeout(busy)
            if ready:
                quiet_since = now
            elif idle is not None and now - quiet_since >= idle_every:
                idle()
                quiet_since = now
            wait = min(deadline - now, idle_every if idle is not None else 3600.0)
            events = poller.poll(wait * 1000.0)
            ready = [busy[fd] for fd, _ in events if fd in busy]

    def _timeout(self, busy: dict[int, ExchangeLink]) -> CommTimeout:
        waiting = [link for link in busy.values() if link.inq] or list(busy.values())
        return stalled(waiting[0].peer, bool(waiting[0].inq))

    def descriptors(self) -> list[int] | None:
        """Each peer's socket descriptor by rank (-1 for this rank), for an engine that moves the frames
        itself (the compiled one, between its calls nothing of theirs is held here); ``None`` where a
        link is not a plain socket (TLS carries it) or the links are closed."""
        socks = {peer: link.sock for peer, link in self._links.items()}
        if len(socks) != self.size - 1 or any(type(sock) is not socket.socket for sock in socks.values()):
            return None
        return [socks[peer].fileno() if peer != self.rank else -1 for peer in range(self.size)]

    def unfinished(self, peer: int, rest: bytes, frame: int) -> None:
        """An engine that moved the frames itself left ``rest``, the end of a ``frame``-byte frame, half
        sent to ``peer``: :meth:`abort` finishes it before its ABORT."""
        link = self._links.get(peer)
        if link is not None and rest:
            link.resume(rest, frame)

    def abort(self, reason: str) -> None:
        """Finish the frames half sent, send every peer ABORT with ``reason``, and close (module docstring)."""
        frame = memoryview(wire.abort_frame(reason))
        links = list(self._links.values())
        self._links = {}
        for link in links:
            link.inq.clear()
            link.end_frame()
            link.push(frame)
            try:
                link.sock.setblocking(False)  # never waits here: read_abort_reason may have left a timeout
                link.send_some()  # at once: the caller may exit before another thread runs
            except (AllreduceError, OSError):
                pass  # the peer is gone: nothing to tell it
        self._closing = threading.Thread(target=_drain, args=(links, time.monotonic() + ABORT_S),
                                         name="allreduce-tcp-abort")  # not a daemon: exit waits (ABORT_S at most)
        self._closing.start()

    def close(self) -> None:
        for link in self._links.values():
            try:
                link.sock.close()
            except OSError:
                pass
        self._links = {}
        if self._closing is not None:
            self._closing.join()


def _drain(links: list[ExchangeLink], deadline: float) -> None:
    """Send what ``links`` hold until each peer has taken it all (acknowledged, so that closing cannot
    lose it), the deadline passes, or no peer takes anything for :data:`ABORT_STALL_S`; then close them."""
    every = list(links)
    moved = time.monotonic()
    while links and time.monotonic() < min(deadline, moved + ABORT_STALL_S):
        left = []
        for link in links:
            before = link.pending()
            try:
                link.send_some()
            except AllreduceError:
                continue
            after = link.pending()
            if after != before:
                moved = time.monotonic()
            if after:
                left.append(link)
        links = left
        poller = select.poll()
        for link in links:
            poller.register(link.fd, _POLLOUT if link.out else 0)
        poller.poll(5)
    for link in every:
        try:
            link.sock.close()
        except OSError:
            pass


