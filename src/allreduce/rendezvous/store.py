"""Key-value stores where ranks meet: the interface, an in-memory store and the TCP store.

Every store speaks the same six requests (:mod:`.storewire`): set, get, add, wait, check, delete.
:class:`Store` turns its public methods into request messages and the answers back into values or
errors; a store class only says how a request is answered (:meth:`Store._execute`), and
:func:`apply_request` holds what each request means, so the in-memory store, the TCP server and the
file store cannot drift apart. A get or wait whose keys are missing is parked until a later change
sets them or its deadline passes, when it is answered :class:`~.storewire.TimedOut` and the caller
gets a :class:`CommTimeout` naming the keys.

:class:`TCPStore` is the store of ``env://`` and ``tcp://``: the rank that hosts it runs a
:class:`_StoreServer`, one daemon thread that serves every client through a selector (a parked get
costs no thread), and connects to it like every other rank. A client keeps a small
pool of connections, one per request in flight, so threads that share a store never queue behind
each other's blocking get. Every connection starts with the mutual challenge-response of
:mod:`allreduce.auth` over the job's secret; the server reads nothing else from a client until it has
passed, holds at most a few dozen bytes for it meanwhile, and closes it if it fails or is too slow.
"""

from __future__ import annotations

import collections
import math
import selectors
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

from allreduce import auth
from allreduce.errors import CommTimeout, PeerLost, ProtocolError, RendezvousError
from allreduce.rendezvous import storewire as wire

DEFAULT_TIMEOUT = 300.0  # seconds a get or wait waits when the call gives no timeout
_CHUNK = 1 << 16  # bytes per recv
_MAX_QUEUED = 64  # requests a client may send ahead of their answers before the server drops it
_BACKLOG = 128  # listen backlog; at least the world size
_HANDSHAKE_S = 10.0  # seconds a new client has to prove it knows the job's secret
_CONTEXT = b"store"  # what a store connection's handshake proves itself for


def apply_request(data: dict[str, bytes], request: wire.Request) -> wire.Response | None:
    """Apply ``request`` to ``data`` and return the answer, or ``None`` while a get/wait must wait.

    Counters are stored as decimal ASCII, so ``get`` of a counter reads e.g. ``b"3"``.
    """
    if isinstance(request, wire.Set):
        data[request.key] = request.value
        return wire.Ok()
    if isinstance(request, wire.Get):
        value = data.get(request.key)
        return None if value is None else wire.Value(value)
    if isinstance(request, wire.Add):
        try:
            count = int(data.get(request.key, b"0").decode("ascii")) + request.amount
        except (UnicodeDecodeError, ValueError):
            return wire.Failed(f"add({request.key!r}): the key holds a value that is not a counter")
        if not wire.I64_MIN <= count <= wire.I64_MAX:
            return wire.Failed(f"add({request.key!r}): the counter would overflow 64 bits")
        data[request.key] = str(count).encode("ascii")
        return wire.Count(count)
    if isinstance(request, wire.Wait):
        return wire.Ok() if all(key in data for key in request.keys) else None
    if isinstance(request, wire.Check):
        return wire.Flag(all(key in data for key in request.keys))
    return wire.Flag(data.pop(request.key, None) is not None)


def timed_out(data: dict[str, bytes], request: wire.Get | wire.Wait) -> wire.TimedOut:
    """The answer to a get or wait whose deadline passed: the keys still missing."""
    keys = (request.key,) if isinstance(request, wire.Get) else request.keys
    return wire.TimedOut(tuple(key for key in keys if key not in data))


def deadline(request: wire.Request) -> float:
    """The monotonic time by which a get or wait must be answered (now, for the other requests)."""
    return time.monotonic() + getattr(request, "timeout_ms", 0) / 1000


class Store:
    """A key-value store shared by the ranks of one job (torch's ``Store`` on bytes).

    Safe to share between threads. ``timeout`` is the default wait of ``get`` and ``wait``, in seconds.
    Methods raise :class:`RendezvousError` once the store is closed, and the TCP store raises
    :class:`PeerLost` if its server goes away.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        if not 0 < timeout < math.inf:
            raise ValueError(f"store timeout must be a positive, finite number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._closed = False

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, replacing any previous value and releasing its waiters."""
        value = bytes(value)
        if len(value) > wire.MAX_VALUE:
            raise ValueError(f"store value of {len(value)} bytes is over the {wire.MAX_VALUE}-byte limit")
        self._call(wire.Set(_key(key), value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds (default ``self.timeout``) for it.

        Raises:
            CommTimeout: the key was not set in time; the message names it.
        """
        return self._call(wire.Get(_key(key), self._timeout_ms(timeout))).value

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter at ``key`` (created at 0); return the new count.

        Example: two ranks each call ``store.add("joined", 1)``; one gets 1, the other 2.

        Raises:
            ValueError: ``key`` holds a value that is not a counter, or the count would overflow.
        """
        if not isinstance(amount, int) or not wire.I64_MIN <= amount <= wire.I64_MAX:
            raise ValueError(f"add amount must be a 64-bit int, got {amount!r}")
        return self._call(wire.Add(_key(key), amount)).count

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> None:
        """Return once every key is set, waiting up to ``timeout`` seconds (default ``self.timeout``).

        Raises:
            CommTimeout: some keys were not set in time; the message lists them.
        """
        self._call(wire.Wait(_keys(keys), self._timeout_ms(timeout)))

    def check(self, keys: Iterable[str]) -> bool:
        """Whether every key is set, without waiting."""
        return self._call(wire.Check(_keys(keys))).flag

    def delete_key(self, key: str) -> bool:
        """Remove ``key``; return whether it was there."""
        return self._call(wire.Delete(_key(key))).flag

    def prefix(self, prefix: str) -> "Store":
        """A view of this store whose keys are ``prefix + "/" + key`` (for subgroups, later rounds)."""
        return PrefixStore(prefix, self)

    @property
    def base(self) -> "Store":
        """The store this one is a view of (itself unless it is a prefix view)."""
        return self

    def close(self) -> None:
        """Release this store's connections (and, on the rank that hosts it, the server)."""
        self._closed = True

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _execute(self, request: wire.Request) -> wire.Response:
        """Answer ``request``, waiting as a get or wait requires; never ``None``."""
        raise NotImplementedError

    def _answer(self, request: wire.Request) -> wire.Response:
        if self._closed:
            raise RendezvousError(f"{self!r} is closed")
        return self._execute(request)

    def _call(self, request: wire.Request) -> wire.Response:
        response = self._answer(request)
        if isinstance(response, wire.TimedOut):
            raise CommTimeout(f"{self!r}: {_describe(request)} timed out after "
                              f"{request.timeout_ms / 1000:g}s; still missing: {_listing(response.missing)}")
        if isinstance(response, wire.Failed):
            raise ValueError(f"{self!r}: {response.message}")
        return response

    def _timeout_ms(self, timeout: float | None) -> int:
        seconds = self.timeout if timeout is None else timeout
        if not seconds >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        return min(math.ceil(seconds * 1000), wire.MAX_TIMEOUT_MS)


def _key(key: str) -> str:
    wire.check_key(key)
    return key


def _keys(keys: Iterable[str]) -> tuple[str, ...]:
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list of str, not a single key")
    return tuple(_key(key) for key in keys)


def _describe(request: wire.Get | wire.Wait) -> str:
    if isinstance(request, wire.Get):
        return f"get({request.key!r})"
    return f"wait for {len(request.keys)} keys"


def _listing(keys: tuple[str, ...], shown: int = 8) -> str:
    listed = ", ".join(repr(key) for key in keys[:shown])
    return listed + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


class PrefixStore(Store):
    """A view of ``store`` whose keys are ``prefix/key``. Closing the view leaves ``store`` open."""

    def __init__(self, prefix: str, store: Store):
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"store prefix must be a non-empty str, got {prefix!r}")
        super().__init__(store.timeout)
        self._prefix = prefix + "/"
        self._store = store

    def __repr__(self) -> str:
        return f"PrefixStore({self._prefix[:-1]!r}, {self._store!r})"

    @property
    def base(self) -> Store:
        return self._store.base

    def _execute(self, request: wire.Request) -> wire.Response:
        if isinstance(request, (wire.Wait, wire.Check)):
            request = replace(request, keys=tuple(self._prefix + key for key in request.keys))
        else:
            request = replace(request, key=self._prefix + request.key)
        return self._store._answer(request)


class HashStore(Store):
    """A store in this process's memory: for threads standing in for ranks, and world size 1."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self._data: dict[str, bytes] = {}
        self._changed = threading.Condition()

    def __repr__(self) -> str:
        return f"HashStore(<{len(self._data)} keys>)"

    def _execute(self, request: wire.Request) -> wire.Response:
        due = deadline(request)
        with self._changed:
            while (response := apply_request(self._data, request)) is None:
                remaining = due - time.monotonic()
                if remaining <= 0:
                    return timed_out(self._data, request)
                self._changed.wait(remaining)
            if isinstance(request, wire.MUTATIONS):
                self._changed.notify_all()
            return response


class _Link:
    """One client connection to a store server: a blocking socket and its response decoder."""

    def __init__(self, sock: socket.socket, where: str):
        self._sock = sock
        self._where = where
        self._decoder = wire.ResponseDecoder()

    def roundtrip(self, request: wire.Request, wait_s: float) -> wire.Response:
        frame = wire.encode(request)
        responses: list = []
        self._sock.settimeout(wait_s)
        try:
            self._sock.sendall(frame)
            while not responses:
                data = self._sock.recv(_CHUNK)
                if not data:
                    break
                responses = self._decoder.feed(data)
        except TimeoutError as exc:
            raise CommTimeout(f"store at {self._where} did not answer within {wait_s:g}s") from exc
        except OSError as exc:
            raise PeerLost(f"store at {self._where} closed the connection ({exc})") from exc
        except ProtocolError as exc:
            raise ProtocolError(f"store at {self._where} sent an invalid frame: {exc}") from exc
        if not responses:
            raise PeerLost(f"store at {self._where} closed the connection")
        if len(responses) > 1 or self._decoder.pending:
            raise ProtocolError(f"store at {self._where} answered more than it was asked")
        return responses[0]

    def close(self) -> None:
        self._sock.close()


class TCPStore(Store):
    """A store served over TCP by one rank and reached by all (the store of ``env://``, ``tcp://``).

    With ``is_server`` this process also hosts the server, bound to exactly ``host`` (``"0.0.0.0"``
    for every interface); port 0 picks a free port, and ``.port`` tells which. Every rank, the host
    included, then connects as a client, retrying with backoff for ``timeout`` seconds since the
    host may start later. ``world_size`` sizes the server's listen backlog.

    Example (two ranks)::

        rank 0: store = TCPStore("10.0.0.1", 29500, is_server=True, timeout=60)
        rank 1: store = TCPStore("10.0.0.1", 29500, is_server=False, timeout=60)
        rank 1: store.set("hello", b"hi")      rank 0: store.get("hello") -> b"hi"

    Raises:
        RendezvousError: the port cannot be bound, or the server cannot be reached within ``timeout``.
    """

    def __init__(self, host: str, port: int, is_server: bool = False, timeout: float = DEFAULT_TIMEOUT,
                 world_size: int | None = None):
        super().__init__(timeout)
        if not isinstance(port, int) or not 0 <= port <= 65535 or (port == 0 and not is_server):
            raise ValueError(f"store port must be 1-65535 (0 only where is_server picks one), got {port!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
            raise ValueError(f"world_size must be a positive int or None, got {world_size!r}")
        self.host = host
        self._server = _StoreServer(host, port, max(_BACKLOG, world_size or 0)) if is_server else None
        self.port = self._server.port if self._server else port
        self._idle: list[_Link] = []
        self._idle_lock = threading.Lock()
        self._reached = False  # a connection succeeded once: a refusal now means the server is gone
        try:
            self._idle.append(self._connect())
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"TCPStore({self.host}:{self.port})"

    @property
    def is_server(self) -> bool:
        """Whether this process hosts the store's server."""
        return self._server is not None

    def close(self) -> None:
        super().close()
        with self._idle_lock:
            links, self._idle = self._idle, []
        for link in links:
            link.close()
        if self._server is not None:
            self._server.close()

    def _execute(self, request: wire.Request) -> wire.Response:
        with self._idle_lock:
            link = self._idle.pop() if self._idle else None
        if link is None:
            link = self._connect()
        try:
            response = link.roundtrip(request, self.timeout + getattr(request, "timeout_ms", 0) / 1000)
        except BaseException:
            link.close()
            raise
        with self._idle_lock:
            if self._closed:
                link.close()
            else:
                self._idle.append(link)
        return response

    def _connect(self) -> _Link:
        where = f"{self.host}:{self.port}"
        address = ({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host), self.port)
        due = time.monotonic() + self.timeout
        pause = 0.01
        while True:
            try:
                sock = socket.create_connection(address, timeout=max(due - time.monotonic(), 0.05))
                break
            except OSError as exc:
                if self._reached and isinstance(exc, ConnectionRefusedError):
                    raise PeerLost(f"the store at {where} is gone (connection refused): the rank that "
                                   f"hosted it exited") from exc
                remaining = due - time.monotonic()
                if remaining <= 0:
                    raise RendezvousError(
                        f"cannot reach the store at {where} within {self.timeout:g}s ({exc}); check that "
                        f"rank 0 is running and that MASTER_ADDR/MASTER_PORT (or the tcp:// address) name "
                        f"its host and a port this host may connect to") from exc
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._handshake(sock)
        self._reached = True
        return _Link(sock, where)

    def _handshake(self, sock: socket.socket) -> None:
        """Prove to the server that this process knows the job's secret and check that it does too,
        before the first request; the server's half starts in :meth:`_StoreServer._accept`."""
        try:
            auth.client_handshake(sock, auth.job_key(), _CONTEXT, time.monotonic() + self.timeout)
        except (OSError, ProtocolError) as exc:
            sock.close()
            raise RendezvousError(f"cannot join the store at {self.host}:{self.port}: {exc}") from exc


class _Peer:
    """The server's state for one client: its decoder, requests not yet answered, unsent output."""

    __slots__ = ("sock", "auth", "decoder", "queue", "current", "due", "out", "writing")

    def __init__(self, sock: socket.socket, responder: auth.Responder):
        self.sock = sock
        self.auth: auth.Responder | None = responder  # the handshake, until the client has passed it
        self.decoder = wire.RequestDecoder()
        self.queue: collections.deque = collections.deque()  # decoded, not yet started
        self.current: wire.Request | None = None  # the request being answered (maybe parked)
        self.due = time.monotonic() + _HANDSHAKE_S  # when ``current`` (first: the handshake) times out
        self.out: collections.deque[memoryview] = collections.deque()  # encoded answers not yet sent
        self.writing = False  # registered for EVENT_WRITE


class _StoreServer:
    """Serves the store to every client from one daemon thread with a selector.

    Each loop waits for sockets (or the nearest deadline of a parked request), reads and decodes what
    arrived, then advances every client in turn until no answer changes the data any more: a set
    thereby releases the gets parked on its key in the same round. A client's requests are answered
    in order, and not until its earlier answers have drained (back-pressure); one that sends an
    invalid frame, or more than ``_MAX_QUEUED`` requests ahead, is disconnected alone.
    """

    def __init__(self, host: str, port: int, backlog: int):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=backlog)
        except OSError as exc:
            raise RendezvousError(f"cannot host the store at {host}:{port} ({exc}); use an address of this "
                                  f"host and a free port (MASTER_PORT or the tcp:// port)") from exc
        self.port = self._listener.getsockname()[1]
        self._key = auth.job_key()
        self._max_strangers = 2 * backlog  # clients mid-handshake at once; more are closed at once
        auth.warn_if_exposed(host)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._data: dict[str, bytes] = {}
        self._peers: set[_Peer] = set()
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
                    if events & selectors.EVENT_WRITE and key.data in self._peers:
                        self._flush(key.data)
                    if events & selectors.EVENT_READ and key.data in self._peers:
                        self._receive(key.data)
                self._advance_all()
        finally:
            for peer in list(self._peers):
                self._drop(peer)
            self._selector.close()
            self._listener.close()
            self._wake_r.close()

    def _next_timeout(self) -> float | None:
        parked = [peer.due for peer in self._peers if peer.current is not None or peer.auth is not None]
        return max(min(parked) - time.monotonic(), 0.0) if parked else None

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # BlockingIOError when no one else is waiting
                return
            if sum(peer.auth is not None for peer in self._peers) >= self._max_strangers:
                sock.close()  # a flood of connections that do not authenticate: refuse, don't pile up
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # The handshake (see TCPStore._handshake): challenge now; the response arrives in _receive,
            # and no byte reaches the client's RequestDecoder before it has passed.
            peer = _Peer(sock, auth.Responder(self._key, _CONTEXT))
            self._peers.add(peer)
            self._selector.register(sock, selectors.EVENT_READ, peer)
            peer.out.append(memoryview(peer.auth.greeting))
            self._flush(peer)

    def _receive(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(_CHUNK)
            peer.queue.extend(peer.decoder.feed(data if peer.auth is None else self._authenticate(peer, data)))
        except BlockingIOError:
            return
        except (OSError, ProtocolError):
            data = b""
        if not data or len(peer.queue) > _MAX_QUEUED:
            self._drop(peer)

    def _authenticate(self, peer: _Peer, data: bytes) -> bytes:
        """Feed the handshake; once the response is in, answer it and return what followed it.

        Raises:
            AuthError: the response was wrong (the refusal is sent; the caller drops the peer).
        """
        reply, rest = peer.auth.feed(data)
        if reply is not None:
            peer.out.append(memoryview(reply))
            self._flush(peer)
            if not peer.auth.passed:
                raise auth.AuthError("a client failed the handshake")
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
            response = apply_request(self._data, peer.current)
            if response is None:
                if time.monotonic() < peer.due:
                    break
                response = timed_out(self._data, peer.current)
            changed |= isinstance(peer.current, wire.MUTATIONS)
            peer.current = None
            peer.out.append(memoryview(wire.encode(response)))
            self._flush(peer)
        return changed

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
