"""The TCP store's client: the store of ``env://`` and ``tcp://`` as every rank sees it.

It changes when how a rank talks to the store's host does: dialling with retries, the handshake,
one request and its answer on a connection, the pool of connections. The rank that hosts the store
also runs its :class:`~.storeserver.StoreServer` and connects to it like every other rank. A client
keeps a small pool of connections, one per request in flight, so threads that share a store never
queue behind each other's blocking get. Every connection first proves, by the mutual
challenge-response of :mod:`allreduce.auth`, that both ends know the job's secret, inside a
mutually authenticated TLS channel when the ``security`` given has TLS (:mod:`allreduce.tls`), and
then asks which server it reached (a random id each server draws): a client talks to one server
only, so once its host closed it and opened another on the same port for a new group, a late
request of the old group (a goodbye, a heartbeat, a failure report) is refused, not stored there.

Every request has a deadline (:meth:`Store.execute_by`), and the client gives up on a silent host
then: a frozen host costs the caller the time it allowed, not a fresh timeout per request. A
connection cut during the handshake is dialled again until the deadline, since the host sheds the
oldest strangers when too many connect at once (:mod:`.storeserver`).
"""

from __future__ import annotations

import socket
import threading
import time

from .. import auth, tls
from ..errors import CommTimeout, PeerLost, ProtocolError, RendezvousError, exhausted
from ..security import Security
from ..settings import DEFAULT_TIMEOUT
from . import storewire
from .contents import StoreLimits
from .store import Store
from .storeserver import HANDSHAKE_CONTEXT, IDENTITY_KEY, RECV_BYTES, StoreServer


class _Link:
    """One client connection to a store server: a blocking socket and its response decoder."""

    def __init__(self, sock: socket.socket, where: str):
        self._sock = sock
        self._where = where
        self._decoder = storewire.ResponseDecoder()

    def roundtrip(self, request: storewire.Request, due: float) -> storewire.Response:
        """Send ``request`` and read its answer by ``due`` (``time.monotonic()``)."""
        frame = storewire.encode(request)
        responses: list = []
        wait_s = max(due - time.monotonic(), 0.0)
        try:
            self._sock.settimeout(_left(due))
            self._sock.sendall(frame)
            while not responses:
                self._sock.settimeout(_left(due))
                data = self._sock.recv(RECV_BYTES)
                if not data:
                    break
                responses = self._decoder.feed(data)
        except TimeoutError as exc:
            raise CommTimeout(f"store at {self._where} did not answer within {wait_s:.3g}s: its host "
                              f"is stopped or overloaded") from exc
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
    host may start later. ``world_size`` sizes the server's listen backlog, and ``limits`` caps what
    it holds. ``security`` is the job's key and TLS (:class:`~allreduce.security.Security`; default: no
    secret, no TLS), the same on every rank: the edge builds it from the settings. ``timeout`` is also
    the default wait of ``get`` and ``wait`` (default: the group's timeout, 10 minutes), and what a
    request may take beyond its wait before the client gives up.

    Example (two ranks)::

        rank 0: store = TCPStore("10.0.0.1", 29500, is_server=True, timeout=60)
        rank 1: store = TCPStore("10.0.0.1", 29500, is_server=False, timeout=60)
        rank 1: store.set("hello", b"hi")      rank 0: store.get("hello") -> b"hi"

    Raises:
        RendezvousError: the port cannot be bound, or the server cannot be reached within ``timeout``.
    """

    def __init__(self, host: str, port: int, is_server: bool = False, timeout: float = DEFAULT_TIMEOUT,
                 world_size: int | None = None, limits: StoreLimits = StoreLimits(),
                 security: Security = Security()):
        super().__init__(timeout)
        if not isinstance(port, int) or not 0 <= port <= 65535 or (port == 0 and not is_server):
            raise ValueError(f"store port must be 1-65535 (0 only where is_server picks one), got {port!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
            raise ValueError(f"world_size must be a positive int or None, got {world_size!r}")
        self.host = host
        self._security = security
        self._server = StoreServer(host, port, world_size, limits, security) if is_server else None
        self.port = self._server.port if self._server else port
        self._idle: list[_Link] = []
        self._idle_lock = threading.Lock()
        self._reached = False  # a connection succeeded once: a refusal now means the server is gone
        self._server_id: bytes | None = None  # the id of the server first reached: every connection's must match
        try:
            self._idle.append(self._connect(time.monotonic() + self.timeout))
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

    def execute(self, request: storewire.Request) -> storewire.Response:
        wait_s = getattr(request, "timeout_ms", 0) / 1000
        return self.execute_by(request, time.monotonic() + self.timeout + wait_s)

    def execute_by(self, request: storewire.Request, due: float) -> storewire.Response:
        with self._idle_lock:
            link = self._idle.pop() if self._idle else None
        if link is None:
            link = self._connect(due)
        try:
            response = link.roundtrip(request, due)
        except BaseException:
            link.close()
            raise
        with self._idle_lock:
            if self.closed:
                link.close()
            else:
                self._idle.append(link)
        return response

    def _connect(self, due: float) -> _Link:
        """A new connection that passed the handshake, dialling again until ``due``: the server may
        start later, or cut us while it sheds strangers."""
        where = f"{self.host}:{self.port}"
        start, pause = time.monotonic(), 0.01
        while True:
            try:
                link = self._dial(due)
            except OSError as exc:  # refused, unreachable, cut during the handshake, or too slow
                if (error := exhausted(exc, f"connecting to the store at {where}")) is not None:
                    raise error from exc
                if self._reached and isinstance(exc, ConnectionRefusedError):
                    raise PeerLost(f"the store at {where} is gone (connection refused): the rank that "
                                   f"hosted it exited") from exc
                remaining = due - time.monotonic()
                if remaining <= 0 and self._reached:
                    raise CommTimeout(f"store at {where} did not let us in within {due - start:.3g}s ({exc}): "
                                      f"its host is stopped or overloaded") from exc
                if remaining <= 0:
                    raise RendezvousError(
                        f"cannot reach the store at {where} within {due - start:.3g}s ({exc}); check that "
                        f"rank 0 is running and that MASTER_ADDR/MASTER_PORT (or the tcp:// address) name "
                        f"its host and a port this host may connect to"
                        f"{'' if self._security.tls or not isinstance(exc, TimeoutError) else _NO_TLS}") from exc
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, 1.0)
                continue
            return self._same_server(link, due)

    def _same_server(self, link: _Link, due: float) -> _Link:
        """``link``, once its server is the one this client reached first: after that server closed,
        its host may open another on the same port (a new group there), whose keys no request meant
        for the old one may touch (a late goodbye, a heartbeat, a failure report)."""
        try:
            server_id = link.roundtrip(storewire.Get(IDENTITY_KEY, 0), due)
            if not isinstance(server_id, storewire.Value):
                raise ProtocolError(f"store at {self.host}:{self.port} did not say which server it is")
        except BaseException:
            link.close()
            raise
        if self._server_id is None:
            self._server_id = server_id.value
        elif server_id.value != self._server_id:
            link.close()
            raise PeerLost(f"the store at {self.host}:{self.port} is gone: a new store serves that port now "
                           f"(its host formed a new group after this one ended)")
        return link

    def _dial(self, due: float) -> _Link:
        """One connection, and the handshake that proves to the server that this process knows the
        job's secret and checks that it does too; the server's half is in :mod:`.storeserver`."""
        address = ({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host), self.port)
        sock = socket.create_connection(address, timeout=_left(due))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._security.check_listener(sock)
            if self._security.tls is not None:
                sock = self._security.tls.dial(sock, due)
            auth.client_handshake(sock, self._security.key, HANDSHAKE_CONTEXT, due)
        except ProtocolError as exc:  # another secret, or not a store at all: dialling again cannot help
            sock.close()
            raise RendezvousError(f"cannot join the store at {self.host}:{self.port}: {exc}") from exc
        except OSError as exc:
            sock.close()
            if tls.refused(exc):  # a certificate, or TLS on one end only: final too
                raise RendezvousError(f"cannot join the store at {self.host}:{self.port}: TLS: "
                                      f"{tls.describe(exc)}") from exc
            raise
        except BaseException:
            sock.close()
            raise
        self._reached = True
        return _Link(sock, f"{self.host}:{self.port}")


_NO_TLS = ("; a store that requires TLS says nothing to a rank without the ALLREDUCE_TLS_* variables, "
           "so check that they are set on every rank or on none")


def _left(due: float) -> float:
    """Seconds until ``due`` for a socket timeout: at least a millisecond, so that a passed deadline
    times out at once instead of turning the socket non-blocking."""
    return max(due - time.monotonic(), 0.001)
