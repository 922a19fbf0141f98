"""How two processes' lifeline ends meet: the authenticated dial, and the answer to one.

No lifeline state here, only the handshake (:mod:`..auth`'s challenge-response bound to
:data:`CONTEXT`, then the dialler's id) and the errors that name who could not be reached.
"""

from __future__ import annotations

import socket
import struct
import time

from .. import auth, logs
from ..errors import RendezvousError
from ..security import Security

_log = logs.get("transport")
CONTEXT = b"allreduce-lifeline"  # what the challenge-response binds the connection to
SEND_S = 5.0  # seconds a message may take to be handed to the kernel (they are a few hundred bytes)
ID = struct.Struct("<I")


class Refused(RendezvousError):
    """Nobody listens at a peer's lifeline address any more: it died or left."""


def dial(address: str, me: int, peer: int, security: Security, deadline: float) -> socket.socket:
    """A connection to ``peer``'s lifeline at ``address``, authenticated and introduced, by ``deadline``.

    Raises:
        Refused: nothing listens there. RendezvousError: it could not be reached or answered in time.
    """
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.001))
    except ConnectionRefusedError as exc:
        raise Refused(f"id {me}: cannot reach the lifeline of id {peer} at {address}: {exc}") from exc
    except OSError as exc:
        raise RendezvousError(f"id {me}: cannot reach the lifeline of id {peer} at {address}: {exc}") from exc
    try:
        security.check_listener(sock)
        auth.client_handshake(sock, security.key, CONTEXT, deadline)
        sock.sendall(ID.pack(me))
    except (OSError, auth.AuthError) as exc:  # it died or stalled mid-handshake, or it is not the peer
        sock.close()
        raise RendezvousError(f"id {me}: the lifeline of id {peer} at {address} failed: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    sock.settimeout(SEND_S)
    return sock


def answer(sock: socket.socket, security: Security) -> int | None:
    """The id of the peer that dialled ``sock``, or ``None`` (``sock`` closed) for a stranger or a failure."""
    deadline = time.monotonic() + SEND_S
    try:
        auth.server_handshake(sock, security.key, CONTEXT, deadline, security.admits)
        peer = ID.unpack(auth.recv_exactly(sock, ID.size, deadline, "saying who it is"))[0]
    except auth.AuthError as exc:
        sock.close()
        _log.warning("lifeline: refused a connection: %s", exc)
        return None
    except OSError as exc:  # the dialler left mid-handshake
        sock.close()
        _log.debug("lifeline: a connection ended before it was made: %s", exc)
        return None
    sock.settimeout(SEND_S)
    return peer
