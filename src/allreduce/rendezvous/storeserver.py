"""The TCP store's server: one daemon thread on the rank that hosts the store serves every client.

It changes when how the host serves does (the selector loop, back-pressure, who is dropped); what
each request means is :func:`~.store.apply_request`, and the client is :mod:`.tcpstore`. The thread
serves every client through a selector, so a parked get costs no thread. Every connection starts
with the mutual challenge-response of :mod:`allreduce.auth` over the job's secret; the server reads
nothing else from a client until it has passed, holds at most a few dozen bytes for it meanwhile,
and closes it if it fails or is too slow. With TLS in its :class:`~..security.Security`, a TLS
handshake that requires the client's certificate (:mod:`allreduce.tls`) comes first, in the same
time. When too many strangers are mid-handshake at once (idle sockets on the port, a scan, a flood),
a new one pushes out the one that has waited longest, so a rank that dials in still gets its turn
(and dials again if it was the one pushed out). Without a secret or TLS, a client that passed the
handshake is still refused if it is another user's process on this host
(:meth:`~..security.Security.admits`). What the store holds is capped by its :class:`~.contents.StoreLimits`.
"""

from __future__ import annotations

import collections
import secrets
import selectors
import socket
import ssl
import threading
import time

from .. import auth
from ..errors import ProtocolError, RendezvousError, exhausted
from ..security import Security
from . import storewire
from .contents import Contents, StoreLimits
from .store import apply_request, deadline, timed_out

HANDSHAKE_CONTEXT = b"store"  # what a store connection's handshake proves itself for (both sides)
RECV_BYTES = 1 << 16  # bytes per recv, on both sides of a store connection
IDENTITY_KEY = "\0server"  # a get of it answers which server this is (a random id), and stores nothing
_MAX_QUEUED = 64  # requests a client may send ahead of their answers before the server drops it
_BACKLOG = 128  # the smallest listen backlog; at least the world size
_HANDSHAKE_S = 10.0  # seconds a new client has to prove it knows the job's secret
_STARVED_S = 0.1  # seconds the server stops accepting when this process is out of descriptors


class _Peer:
    """The server's state for one client: its decoder, requests not yet answered, unsent output."""

    __slots__ = ("sock", "shaking", "auth", "decoder", "queue", "current", "due", "out", "writing")

    def __init__(self, sock: socket.socket, responder: auth.Responder):
        self.sock = sock
        self.shaking = isinstance(sock, ssl.SSLSocket)  # its TLS handshake is not done yet
        self.auth: auth.Responder | None = responder  # the handshake, until the client has passed it
        self.decoder = storewire.RequestDecoder()
        self.queue: collections.deque = collections.deque()  # decoded, not yet started
        self.current: storewire.Request | None = None  # the request being answered (maybe parked)
        self.due = time.monotonic() + _HANDSHAKE_S  # when ``current`` (first: the handshake) times out
        self.out: collections.deque[memoryview] = collections.deque()  # encoded answers not yet sent
        self.writing = False  # registered for EVENT_WRITE


class StoreServer:
    """Serves the store at exactly ``host:port`` (port 0: a free one, see ``.port``) until closed.

    ``clients`` (the world size, if known) sizes the listen backlog; ``limits`` caps what the store holds;
    every client must prove itself with ``security``.

    Each loop waits for sockets (or the nearest deadline of a parked request), reads and decodes what
    arrived, then advances every client in turn until no answer changes the data any more: a set
    thereby releases the gets parked on its key in the same round. A client's requests are answered
    in order, and not until its earlier answers have drained (back-pressure); one that sends an
    invalid frame, or more than ``_MAX_QUEUED`` requests (or more than one frame's worth of values)
    ahead, is disconnected alone.

    Raises:
        RendezvousError: ``host:port`` cannot be bound.
    """

    def __init__(self, host: str, port: int, clients: int | None, limits: StoreLimits, security: Security):
        backlog = max(_BACKLOG, clients or 0)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=backlog)
        except OSError as exc:
            raise RendezvousError(f"cannot host the store at {host}:{port} ({exc}); use an address of this "
                                  f"host and a free port (MASTER_PORT or the tcp:// port)") from exc
        self.port = self._listener.getsockname()[1]
        self._security = security
        self._key = security.key
        self._tls = security.tls
        self._max_strangers = 2 * backlog  # clients mid-handshake at once; a new one pushes out the oldest
        auth.warn_if_exposed(host, security.key)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._data = Contents(limits)
        self.identity = secrets.token_bytes(16)  # tells a client a later server on the same port from this one
        self._peers: set[_Peer] = set()
        self._starved_until: float | None = None  # out of descriptors: the listener rests until then
        self._thread = threading.Thread(target=self._serve, name=f"allreduce-store:{self.port}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, drop every client and close the listening socket."""
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # already closed
        self._thread.join()
        self._wake_w.close()

    def _serve(self) -> None:
        try:
            while True:
                for key, events in self._selector.select(self._next_timeout()):
                    if key.fileobj is self._wake_r:
                        return
                    if key.fileobj is self._listener:
                        self._accept()
                        continue
                    if key.data in self._peers and key.data.shaking:
                        self._shake(key.data)
                        continue
                    if events & selectors.EVENT_WRITE and key.data in self._peers:
                        self._flush(key.data)
                    if events & selectors.EVENT_READ and key.data in self._peers:
                        self._receive(key.data)
                self._advance_all()
                if self._starved_until is not None and time.monotonic() >= self._starved_until:
                    self._starved_until = None
                    self._selector.register(self._listener, selectors.EVENT_READ)
        finally:
            for peer in list(self._peers):
                self._drop(peer)
            self._selector.close()
            self._listener.close()
            self._wake_r.close()

    def _next_timeout(self) -> float | None:
        parked = [peer.due for peer in self._peers if peer.current is not None or peer.auth is not None]
        parked += [self._starved_until] if self._starved_until is not None else []
        return max(min(parked) - time.monotonic(), 0.0) if parked else None

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError as exc:  # BlockingIOError when no one else is waiting
                if exhausted(exc, "") is not None:  # EMFILE: the connection stays queued; rest, don't spin
                    self._selector.unregister(self._listener)
                    self._starved_until = time.monotonic() + _STARVED_S
                return
            strangers = [peer for peer in self._peers if peer.auth is not None]
            if len(strangers) >= self._max_strangers:  # shed, don't pile up nor shut out who comes next
                self._drop(min(strangers, key=lambda peer: peer.due))
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(sock if self._tls is None else self._tls.wrap_accepted(sock),
                         auth.Responder(self._key, HANDSHAKE_CONTEXT))
            self._peers.add(peer)
            self._selector.register(peer.sock, selectors.EVENT_READ, peer)
            if peer.shaking:
                self._shake(peer)
            else:
                self._challenge(peer)

    def _shake(self, peer: _Peer) -> None:
        """Take the TLS handshake as far as what has arrived allows; once it is done, challenge."""
        try:
            peer.sock.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(peer.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, peer)
            return
        except OSError:  # no certificate, another CA's, not TLS at all, or gone
            self._drop(peer)
            return
        peer.shaking = False
        self._selector.modify(peer.sock, selectors.EVENT_READ, peer)
        self._challenge(peer)

    def _challenge(self, peer: _Peer) -> None:
        """The handshake (the client's half is in tcpstore): challenge now; the response arrives in
        _receive, and no byte reaches the client's RequestDecoder before it has passed."""
        peer.out.append(memoryview(peer.auth.greeting))
        self._flush(peer)

    def _receive(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(RECV_BYTES)
            peer.queue.extend(peer.decoder.feed(data if peer.auth is None else self._authenticate(peer, data)))
        except BlockingIOError:
            return
        except (OSError, ProtocolError):
            data = b""
        if not data or len(peer.queue) > _MAX_QUEUED or _held(peer.queue) > storewire.MAX_VALUE:
            self._drop(peer)

    def _authenticate(self, peer: _Peer, data: bytes) -> bytes:
        """Feed the handshake; once the response is in, answer it and return what followed it.

        Raises:
            AuthError: the response was wrong, or its maker is another user's process (the refusal is sent;
                the caller drops the peer).
        """
        reply, rest = peer.auth.feed(data)
        if reply is not None:
            stranger = peer.auth.passed and not self._security.admits(peer.sock)
            peer.out.append(memoryview(auth.STRANGER if stranger else reply))
            self._flush(peer)
            if not peer.auth.passed or stranger:
                raise auth.AuthError("a client failed the handshake, or is another user's process")
            peer.auth = None
        return rest

    def _advance_all(self) -> None:
        changed = True
        while changed:
            changed = False
            for peer in list(self._peers):
                changed |= self._advance(peer)

    def _advance(self, peer: _Peer) -> bool:
        """Answer what ``peer`` asked, in order, as far as possible; return whether the data changed."""
        if peer.auth is not None:  # still proving itself: nothing to answer, and dropped once late
            if time.monotonic() >= peer.due:
                self._drop(peer)
            return False
        changed = False
        while peer in self._peers and not peer.out:
            if peer.current is None:
                if not peer.queue:
                    break
                peer.current = peer.queue.popleft()
                peer.due = deadline(peer.current)
            response = self._answer(peer.current)
            if response is None:
                if time.monotonic() < peer.due:
                    break
                response = timed_out(self._data, peer.current)
            changed |= isinstance(peer.current, storewire.MUTATIONS)
            peer.current = None
            peer.out.append(memoryview(storewire.encode(response)))
            self._flush(peer)
        return changed

    def _answer(self, request: storewire.Request) -> storewire.Response | None:
        """The response to ``request`` (``None`` while it waits); a get of :data:`IDENTITY_KEY` is this server's id."""
        if isinstance(request, storewire.Get) and request.key == IDENTITY_KEY:
            return storewire.Value(self.identity)
        return apply_request(self._data, request)

    def _flush(self, peer: _Peer) -> None:
        try:
            while peer.out:
                sent = peer.sock.send(peer.out[0])
                if sent < len(peer.out[0]):
                    peer.out[0] = peer.out[0][sent:]
                    break
                peer.out.popleft()
        except BlockingIOError:
            pass
        except OSError:
            self._drop(peer)
            return
        if peer.writing != bool(peer.out):
            peer.writing = bool(peer.out)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.writing else 0)
            self._selector.modify(peer.sock, events, peer)

    def _drop(self, peer: _Peer) -> None:
        if peer in self._peers:
            self._peers.discard(peer)
            self._selector.unregister(peer.sock)
            peer.sock.close()


def _held(queue: collections.deque) -> int:
    """Bytes of the values in requests not yet answered."""
    return sum(len(request.value) for request in queue if isinstance(request, storewire.Set))
