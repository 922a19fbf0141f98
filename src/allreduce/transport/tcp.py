"""TCP transport: one connection per pair of ranks, all progressed by a single poll loop.

Links are set up once, when the group forms: every rank listens on the address it was given, publishes
it in the store, connects to every lower rank and accepts every higher one (:mod:`.mesh`). A short
hello (:mod:`.hello`: magic, the group's tag, both ranks) says which link a connection is meant to be,
and the mutual challenge-response of :mod:`..auth`, bound to that hello, proves that both ends know
the job's secret (without one, a peer on this host must run as this user, :mod:`..peercred`); any
other connection is closed at once and the group forms without it. With the
``ALLREDUCE_TLS_*`` variables set (the :class:`~..security.Security` given), a mutually authenticated
TLS handshake (:mod:`..tls`) comes first and carries everything after it. Links use TCP keepalive, so a link that dies silently (cable,
switch) while a rank waits on it errors within about ten seconds rather than only at the collective's
deadline. (Not ``TCP_USER_TIMEOUT``: it would also cut the link to a peer that is alive but busy,
whose full receive buffer holds our data unacknowledged.)

During a collective the sockets are non-blocking. :meth:`TcpTransport.exchange` pushes header and
payload with one ``sendmsg`` and receives straight into the destination memoryview with ``recv_into``
(no copies), sending and receiving at once so two peers exchanging large segments never deadlock on
full socket buffers. It reads exactly the frames it expects: data from a peer that is already a step
ahead waits in the kernel until its step comes.

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

import fcntl
import select
import socket
import termios
import threading
import time
from collections import deque
from collections.abc import Container
from itertools import islice

from .. import auth, tls, wire
from ..errors import AllreduceError, CommTimeout, PeerLost, ProtocolError, RendezvousError, exhausted, with_peer
from ..security import Security
from . import hello, mesh
from .base import RecvSpec, SendSpec, Transport

HELLO = hello.Format(b"ARHI")  # no terms: the handshake that follows proves the rest
_KEEPALIVE = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3}  # idle s, s between probes, probes
_IOV_MAX = 64  # buffers per sendmsg call
_SMALL_FRAME = 1 << 16  # payloads up to this size are read together with their header
_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT
ABORT_S = 0.5  # the most seconds an abort spends getting its frames out before it closes the links
ABORT_STALL_S = 0.25  # ... and the most it waits while no peer takes anything


class _Link:
    """The connection to one peer and the frames in flight on it during one exchange."""

    __slots__ = ("peer", "sock", "fd", "out", "frames", "sent", "inq", "hdr", "hdr_view", "hdr_got", "got")

    def __init__(self, peer: int, sock: socket.socket):
        self.peer = peer
        self.sock = sock
        self.fd = sock.fileno()
        self.out: deque[memoryview] = deque()
        self.frames: deque[int] = deque()  # the sizes of the frames in ``out``
        self.sent = 0  # bytes of the first of them already sent
        self.inq: deque[RecvSpec] = deque()
        self.hdr = bytearray(wire.HEADER_SIZE)
        self.hdr_view = memoryview(self.hdr)
        self.hdr_got = 0
        self.got = 0

    def lost(self, exc: BaseException | None = None) -> PeerLost:
        return lost(self.peer, exc)

    def push(self, *buffers: memoryview) -> None:
        """Queue one frame: its header and payload buffers."""
        self.out.extend(b for b in buffers if b.nbytes)
        self.frames.append(sum(b.nbytes for b in buffers))

    def end_frame(self) -> None:
        """Drop what is queued after the frame being sent (all of it when none is half sent), and copy
        the rest of that frame out of the caller's memory."""
        rest = self.frames[0] - self.sent if self.sent else 0
        kept: deque[memoryview] = deque()
        while rest:
            head = memoryview(bytes(self.out.popleft()[:rest]))
            kept.append(head)
            rest -= head.nbytes
        self.out = kept
        self.frames = deque([self.frames[0]] if kept else [])

    def pending(self) -> int:
        """Bytes queued here or sent but not yet acknowledged by the peer."""
        return sum(b.nbytes for b in self.out) + _unacked(self.sock)

    def send_some(self) -> None:
        """Send until the socket is full or nothing is left."""
        out = self.out
        while out:
            try:
                n = self.sock.sendmsg(list(islice(out, _IOV_MAX)))
            except BlockingIOError:
                return
            except OSError as exc:
                raise self.broken(exc) from exc
            self.sent += n
            while self.frames and self.sent >= self.frames[0]:
                self.sent -= self.frames.popleft()
            while n:
                head = out[0]
                if n >= head.nbytes:
                    n -= head.nbytes
                    out.popleft()
                else:
                    out[0] = head[n:]
                    n = 0

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



def lost(peer: int, exc: BaseException | None = None) -> PeerLost:
    """The error for the link to ``peer`` closed or failed (``exc``, the OS's error, if any)."""
    why = f" ({exc.strerror or exc})" if isinstance(exc, OSError) else ""
    return with_peer(PeerLost(f"connection to rank {peer} closed{why}: it exited, crashed or aborted"), peer)


def aborted(peer: int, reason: str) -> PeerLost:
    """The error for an ABORT frame from ``peer`` giving ``reason``."""
    return with_peer(PeerLost(f"rank {peer} aborted: {reason}"), peer)


def unexpected(peer: int, expected: wire.Header, got: bytes) -> AllreduceError | None:
    """The error for a header ``got`` from ``peer`` where ``expected`` was due (not an ABORT):
    ``ProtocolError`` for bytes that are no header, ``Mismatch`` naming every field that differs;
    ``None`` where the fields agree (only padding differs)."""
    try:
        header = wire.decode(got)
    except ProtocolError as exc:
        return with_peer(ProtocolError(f"from rank {peer}: {exc}"), peer)
    try:
        wire.check(expected, header)
    except AllreduceError as exc:
        return with_peer(type(exc)(f"rank {peer}: {exc}"), peer)
    return None


def stalled(peer: int, receiving: bool) -> CommTimeout:
    """The error at the deadline for the link to ``peer``, still receiving or still sending."""
    return with_peer(CommTimeout(f"{'waiting for' if receiving else 'waiting to send to'} rank {peer}"), peer)


class TcpTransport(Transport):
    """Full mesh of TCP links for one group; see the module docstring."""

    def __init__(self, rank: int, size: int, links: dict[int, socket.socket]):
        self.rank = rank
        self.size = size
        self._links = {peer: _Link(peer, sock) for peer, sock in links.items()}
        self._closing: threading.Thread | None = None  # what abort left to finish sending, then close
        for link in self._links.values():
            link.sock.setblocking(False)

    @classmethod
    def connect(cls, rank: int, size: int, store, host: str, tag: str, timeout: float,
                security: Security) -> "TcpTransport":
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
        busy: dict[int, _Link] = {}
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

    def _progress(self, busy: dict[int, _Link], deadline: float, idle, idle_every: float) -> None:
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

    def _timeout(self, busy: dict[int, _Link]) -> CommTimeout:
        waiting = [l for l in busy.values() if l.inq] or list(busy.values())
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
            link.out, link.frames, link.sent = deque([memoryview(rest)]), deque([frame]), frame - len(rest)

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


class TcpPeering:
    """The TCP side of the mesh (:mod:`.mesh`): inet sockets, a hello, then the job's challenge-response.

    Example (what rank 1 of a two-rank group does to link with rank 0)::

        link = mesh.dial(TcpPeering(1, 2, "127.0.0.1", "g", Security()), store, 0, deadline)
    """

    kind = "tcp"
    joining = "connect"

    def __init__(self, rank: int, size: int, host: str, tag: str, security: Security,
                 dialers: Container[int] | None = None):
        self.rank = rank
        self.size = size
        self.host = host
        self.digest = hello.group_digest(tag)
        self.security = security
        self.key = security.key
        self.tls = security.tls
        self.dialers = range(rank + 1, size) if dialers is None else dialers  # who may dial: the mesh's higher ranks

    def listen(self, backlog: int) -> tuple[socket.socket, str]:
        listener = socket.create_server((self.host, 0), backlog=backlog)
        return listener, f"{self.host}:{listener.getsockname()[1]}"

    def dial(self, peer: int, address: str, deadline: float) -> socket.socket:
        """Connect to a lower rank, say hello and authenticate both ways; retry until the deadline.

        A refused connection is final: ``peer`` listens from before it publishes its address until every
        higher rank has connected, so a refusal means it is gone. So is a failed handshake (different
        secrets): retrying cannot mend it.
        """
        host, port = address.rsplit(":", 1)
        greeting = HELLO.encode(hello.Hello(self.rank, peer, self.digest))
        last = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
            except ConnectionRefusedError as exc:
                raise with_peer(PeerLost(f"rank {self.rank} could not connect to rank {peer} at {address}: "
                                         f"connection refused, so rank {peer} exited or failed while the group "
                                         f"was forming"), peer) from exc
            except OSError as exc:
                if (error := exhausted(exc, f"connecting to rank {peer}")) is not None:
                    raise error from exc
                last = exc
                time.sleep(0.05)
                continue
            try:
                self.security.check_listener(sock)
                if self.tls is not None:
                    sock = self.tls.dial(sock, deadline)
                sock.sendall(greeting)
                auth.client_handshake(sock, self.key, b"peer" + greeting, deadline)
                _tune(sock)
                sock.settimeout(None)
                return sock
            except auth.AuthError as exc:
                sock.close()
                raise with_peer(RendezvousError(f"rank {self.rank} could not authenticate with rank {peer} at "
                                                f"{address}: {exc}"), peer) from exc
            except (OSError, ProtocolError) as exc:
                sock.close()
                if tls.refused(exc):  # a certificate, or TLS on one end only: final too
                    raise with_peer(RendezvousError(f"rank {self.rank} could not link with rank {peer} at "
                                                    f"{address}: TLS: {tls.describe(exc)}"), peer) from exc
                last = exc
            time.sleep(0.05)
        raise RendezvousError(f"rank {self.rank} could not connect to rank {peer} at {address}: {last}")

    def answer(self, sock: socket.socket, due: float) -> tuple[int, socket.socket] | None:
        """Check an accepted connection's hello, proof and maker; ``None`` (closed) for a stranger."""
        decoder = hello.Decoder(HELLO, hello.Expected(self.rank, self.digest, self.dialers))
        try:
            if self.tls is not None:
                sock = self.tls.accept(sock, due)
            sock.settimeout(max(0.1, due - time.monotonic()))
            greeting = None
            while greeting is None:
                chunk = sock.recv(decoder.missing)
                if not chunk:
                    raise ProtocolError("connection closed during the hello")
                greeting, _ = decoder.feed(chunk)
            auth.server_handshake(sock, self.key, b"peer" + HELLO.encode(greeting), due, self.security.admits)
            _tune(sock)
            sock.settimeout(None)
            return greeting.sender, sock
        except (OSError, ProtocolError):
            sock.close()
            return None

    @staticmethod
    def knock(address: str) -> None:
        host, port = address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=1.0).close()


def _drain(links: list[_Link], deadline: float) -> None:
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


def _unacked(sock: socket.socket) -> int:
    """Bytes sent on ``sock`` that its peer has not acknowledged (0 where the OS cannot tell)."""
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"), "little")
    except OSError:
        return 0


def _tune(sock: socket.socket) -> None:
    """No Nagle delay, and keepalive probes on an idle link, so that a silently dead one errors
    within seconds (options missing on this OS are skipped)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE.items():
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def read_abort_reason(sock, data: bytes, nbytes: int) -> str:
    """An ABORT frame's reason of ``nbytes``: ``data`` already read, and what follows within a second."""
    sock.settimeout(1.0)
    try:
        while len(data) < nbytes:
            chunk = sock.recv(nbytes - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode("utf-8", "replace") or "no reason given"
