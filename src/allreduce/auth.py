"""Mutual authentication of every connection by the job's secret: a challenge and response over HMAC.

Both ends of a new connection prove that they know the job's secret without sending it, and every
proof covers fresh random nonces from both ends, so a recorded exchange is worth nothing later. The
end that accepted the connection (the server) speaks first::

    server -> client   challenge: magic "ARau", version, the server's 32-byte nonce
    client -> server   response:  the client's 32-byte nonce, HMAC(key, "client", context, both nonces)
    server -> client   proof:     HMAC(key, "server", context, both nonces), or the refusal "ARno" + zeros

The server checks the client's MAC before it computes one of its own, so a stranger never gets a MAC
out of a server; the two directions carry different labels, so one side's proof cannot be reflected
back as the other's. ``context`` binds the proofs to what the connection is for (the store, or the
link between two given ranks of a given group). MACs are compared in constant time. A server that
refuses a client says so in a fixed message (no MAC, nothing secret) and closes the connection, so a
rank with the wrong secret is told so, rather than left to guess whether the server died.

The key is ``ALLREDUCE_SECRET`` (``allreduce run`` sets a fresh one per job unless the user set one),
read at the edge into :class:`~.settings.Settings` and handed down in a :class:`~.security.Security`.
Without it the handshake still runs, keyed by a constant everyone knows: it then keeps out processes
that speak another protocol or belong to another group, but anyone who can reach the port passes it.
It checks membership; it does not authenticate: a server then also checks who passed it
(:meth:`~.security.Security.admits`) and answers another user's process :data:`STRANGER`. Only the
start of a connection is protected: the frames after the handshake are neither encrypted nor signed,
so an attacker who can rewrite packets on the path can still tamper with them (set the
``ALLREDUCE_TLS_*`` variables, :mod:`.tls`, or use a private network or a VPN/IPsec, against that).
With TLS the handshake runs inside it.

Everything here but the two blocking helpers is sans-I/O (bytes in, bytes out): :class:`Responder`
is the server's half for an event loop, :func:`client_handshake` and :func:`server_handshake` run
either half on a blocking socket against a deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable

from .addresses import is_loopback
from .errors import ProtocolError

MAGIC = b"ARau"
VERSION = 1
NONCE_SIZE = 32
MAC_SIZE = 32  # HMAC-SHA256
_CHALLENGE = struct.Struct("!4sB32s")
CHALLENGE_SIZE = _CHALLENGE.size  # bytes the server sends first
RESPONSE_SIZE = NONCE_SIZE + MAC_SIZE  # bytes the client answers
PROOF_SIZE = MAC_SIZE  # bytes the server answers last
REFUSAL = b"ARno" + bytes(PROOF_SIZE - 4)  # what the server answers instead of a proof to a wrong response
STRANGER = b"ARus" + bytes(PROOF_SIZE - 4)  # what it answers instead of a proof to another user's process
PUBLIC_KEY = b"allreduce: no ALLREDUCE_SECRET was set"  # well known: membership only, not secrecy
_LENGTH = struct.Struct("!I")

_log = logging.getLogger("allreduce")
_warned = False


class AuthError(ProtocolError):
    """The other end of a connection did not prove that it knows the job's secret."""


def job_key(secret: str) -> bytes:
    """The HMAC key of a job whose secret is ``secret`` (``ALLREDUCE_SECRET``; "": the well-known key)."""
    return secret.encode() if secret else PUBLIC_KEY


def warn_if_exposed(host: str, key: bytes) -> None:
    """Log once per process when a server binds beyond loopback with the well-known key (no secret)."""
    global _warned
    if _warned or key != PUBLIC_KEY or is_loopback(host):
        return
    _warned = True
    _log.warning("allreduce: listening on %s without ALLREDUCE_SECRET: connections are checked for group "
                 "membership only, and anyone who can reach this address can join. Set the same "
                 "ALLREDUCE_SECRET on every rank (allreduce run sets one for single-node jobs).", host)


# ---- the three messages, sans-I/O ---------------------------------------------------------------

def challenge() -> tuple[bytes, bytes]:
    """A fresh server nonce and the challenge message that carries it."""
    nonce = secrets.token_bytes(NONCE_SIZE)
    return nonce, _CHALLENGE.pack(MAGIC, VERSION, nonce)


def read_challenge(message: bytes) -> bytes:
    """The server nonce in a challenge; ``ProtocolError`` if ``message`` is not one."""
    if len(message) != CHALLENGE_SIZE:
        raise ProtocolError(f"handshake challenge must be {CHALLENGE_SIZE} bytes, got {len(message)}")
    magic, version, nonce = _CHALLENGE.unpack(message)
    if magic != MAGIC:
        raise ProtocolError(f"handshake challenge starts with {magic!r}, not {MAGIC!r} (not an allreduce server?)")
    if version != VERSION:
        raise ProtocolError(f"server speaks handshake version {version}, this process speaks {VERSION}")
    return nonce


def respond(key: bytes, context: bytes, server_nonce: bytes) -> tuple[bytes, bytes]:
    """A fresh client nonce and the response proving the client knows ``key``."""
    nonce = secrets.token_bytes(NONCE_SIZE)
    return nonce, nonce + _mac(key, b"client", context, server_nonce, nonce)


def check_response(key: bytes, context: bytes, server_nonce: bytes, message: bytes) -> bytes:
    """The client nonce of a valid response; ``AuthError`` if the client does not know ``key``."""
    if len(message) != RESPONSE_SIZE:
        raise AuthError(f"handshake response must be {RESPONSE_SIZE} bytes, got {len(message)}")
    nonce, mac = message[:NONCE_SIZE], message[NONCE_SIZE:]
    if not hmac.compare_digest(mac, _mac(key, b"client", context, server_nonce, nonce)):
        raise AuthError("the client's proof is wrong: it does not know this job's secret")
    return nonce


def prove(key: bytes, context: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The server's proof that it knows ``key``, sent once the client's response checked out."""
    return _mac(key, b"server", context, server_nonce, client_nonce)


def check_proof(key: bytes, context: bytes, server_nonce: bytes, client_nonce: bytes, proof: bytes) -> None:
    """``AuthError`` unless ``proof`` shows that the server knows ``key``."""
    if not hmac.compare_digest(proof, prove(key, context, server_nonce, client_nonce)):
        raise AuthError("the server's proof is wrong: it does not know this job's secret")


def _mac(key: bytes, label: bytes, context: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    message = label + _LENGTH.pack(len(context)) + context + server_nonce + client_nonce
    return hmac.new(key, message, hashlib.sha256).digest()


class Responder:
    """The server's half for an event loop: send :attr:`greeting`, then :meth:`feed` what arrives.

    It never holds more than :data:`RESPONSE_SIZE` bytes, whatever a client sends. :attr:`passed`
    is ``None`` until the response is in, then whether it was right.
    """

    def __init__(self, key: bytes, context: bytes):
        self._key = key
        self._context = context
        self._nonce, self.greeting = challenge()
        self._got = bytearray()
        self.passed: bool | None = None

    def feed(self, data: bytes) -> tuple[bytes | None, bytes]:
        """Take bytes from the client; ``(None, b"")`` while more is needed, then ``(reply, rest)``:
        send ``reply`` (our proof, or :data:`REFUSAL` when :attr:`passed` is false: then close);
        ``rest`` is what followed the response.
        """
        need = RESPONSE_SIZE - len(self._got)
        self._got += data[:need]
        if len(self._got) < RESPONSE_SIZE:
            return None, b""
        try:
            client_nonce = check_response(self._key, self._context, self._nonce, bytes(self._got))
        except AuthError:
            self.passed = False
            return REFUSAL, b""
        self.passed = True
        return prove(self._key, self._context, self._nonce, client_nonce), bytes(data[need:])


# ---- blocking helpers ---------------------------------------------------------------------------

def client_handshake(sock: socket.socket, key: bytes, context: bytes, deadline: float) -> None:
    """Run the client's half on ``sock`` by ``deadline`` (a ``time.monotonic()`` value).

    Raises:
        AuthError: the server refused our response (different secrets) or gave a wrong proof.
        ProtocolError: what came first was not a challenge.
        OSError: the connection failed, or the deadline passed (``TimeoutError``).
    """
    server_nonce = read_challenge(recv_exactly(sock, CHALLENGE_SIZE, deadline))
    client_nonce, response = respond(key, context, server_nonce)
    sock.sendall(response)
    proof = recv_exactly(sock, PROOF_SIZE, deadline)
    if proof == REFUSAL:
        raise AuthError("the server refused our proof: it has another secret (set the same "
                        "ALLREDUCE_SECRET on every rank)")
    if proof == STRANGER:
        raise AuthError("the server refused this connection: it comes from another user's process on the "
                        "server's host (without ALLREDUCE_SECRET, the ranks of a host must run as one user)")
    check_proof(key, context, server_nonce, client_nonce, proof)


def server_handshake(sock: socket.socket, key: bytes, context: bytes, deadline: float,
                     admits: Callable[[socket.socket], bool] = lambda sock: True) -> None:
    """Run the server's half on ``sock`` by ``deadline``; ``AuthError`` or ``OSError`` when it fails.

    A client that passed is let in only if ``admits(sock)`` (else it is answered :data:`STRANGER`).
    """
    responder = Responder(key, context)
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    sock.sendall(responder.greeting)
    reply, _ = responder.feed(recv_exactly(sock, RESPONSE_SIZE, deadline))
    stranger = responder.passed and not admits(sock)
    sock.sendall(STRANGER if stranger else reply)
    if not responder.passed:
        raise AuthError("the client's proof is wrong: it does not know this job's secret")
    if stranger:
        raise AuthError("the client is another user's process")


def recv_exactly(sock: socket.socket, size: int, deadline: float, what: str = "the handshake") -> bytes:
    """``size`` bytes from ``sock`` by ``deadline`` (``time.monotonic``); ``what`` they are, for the errors."""
    data = bytearray()
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} not done by its deadline ({len(data)} of {size} bytes in)")
        sock.settimeout(left)
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed during {what} ({len(data)} of {size} bytes in)")
        data += chunk
    return bytes(data)
