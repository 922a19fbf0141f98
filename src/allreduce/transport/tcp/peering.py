"""How a TCP link is made: every rank listens on the address it was given, dials the lower ranks and
accepts the higher ones (:mod:`..mesh`); a short hello (:mod:`..hello`: magic, the group's tag, both
ranks) says which link a connection is meant to be, and the mutual challenge-response of
:mod:`...auth`, bound to that hello, proves that both ends know the job's secret (without one, a peer
on this host must run as this user, :mod:`...peercred`); any other connection is closed at once. With
the ``ALLREDUCE_TLS_*`` variables set (the :class:`~...security.Security` given), a mutually
authenticated TLS handshake (:mod:`...tls`) comes first and carries everything after it. Links use TCP
keepalive, so a link that dies silently (cable, switch) while a rank waits on it errors within about
ten seconds rather than only at the collective's deadline. (Not ``TCP_USER_TIMEOUT``: it would also
cut the link to a peer that is alive but busy, whose full receive buffer holds our data unacknowledged.)
"""

from __future__ import annotations

import socket
import time
from collections.abc import Container

from ... import auth, tls
from ...errors import PeerLost, ProtocolError, RendezvousError, exhausted, with_peer
from ...security import Security
from .. import hello

HELLO = hello.Format(b"ARHI")  # no terms: the handshake that follows proves the rest
_KEEPALIVE = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3}  # idle s, s between probes, probes


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


def _tune(sock: socket.socket) -> None:
    """No Nagle delay, and keepalive probes on an idle link, so that a silently dead one errors
    within seconds (options missing on this OS are skipped)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE.items():
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
