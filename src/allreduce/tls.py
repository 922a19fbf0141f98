"""Optional TLS for every TCP connection: the store's and the links between ranks.

With ``ALLREDUCE_TLS_CERT``, ``ALLREDUCE_TLS_KEY`` and ``ALLREDUCE_TLS_CA`` set (all three, on every
rank), each connection starts with a TLS 1.3 handshake in which *both* ends present a certificate
signed by that CA and check the other's, and everything after it is encrypted and authenticated. It
proves membership of the CA's job, not a host name: ranks dial addresses, and any certificate the CA
signed is accepted, so give each job its own CA (or at least one no other service trusts). The job
secret's challenge-response (:mod:`.auth`) still runs inside the TLS channel, binding each connection
to its purpose (the store, one link of one group) as it does without TLS. The contexts are loaded
once per set of files (:func:`load`) and reach the connections in a :class:`~.security.Security`.

:class:`TlsSocket` makes an SSL socket read and write like the plain sockets the non-blocking code
expects ("would block" is ``BlockingIOError``; ``sendmsg``/``recvmsg_into`` use the first buffer
only, since TLS has no gather I/O), so the transports and the store keep one code path.
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_WOULD_BLOCK = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
Buffer = Any  # whatever has the buffer protocol (typing's Buffer needs Python 3.12)


class TlsSocket(ssl.SSLSocket):
    """An SSL socket that non-blocking code can drive as it drives a plain one (module docstring)."""

    def recv_into(self, buffer: Buffer, nbytes: int | None = 0, flags: int = 0) -> int:
        try:
            return super().recv_into(buffer, nbytes, flags)
        except _WOULD_BLOCK as exc:
            raise BlockingIOError(str(exc)) from None

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        try:
            return super().recv(buflen, flags)
        except _WOULD_BLOCK as exc:
            raise BlockingIOError(str(exc)) from None

    def send(self, data: Buffer, flags: int = 0) -> int:
        try:
            return super().send(data, flags)
        except _WOULD_BLOCK as exc:
            raise BlockingIOError(str(exc)) from None

    def sendmsg(self, buffers: Sequence[Buffer], *_: object) -> int:  # type: ignore[override]
        return self.send(buffers[0])

    def recvmsg_into(  # type: ignore[override]
            self, buffers: Sequence[Buffer], *_: object) -> tuple[int, list[object], int, None]:
        return self.recv_into(buffers[0]), [], 0, None


@dataclass(frozen=True)
class Tls:
    """The two TLS contexts of this process: as the end that accepts, and as the end that dials."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    def accept(self, sock: socket.socket, deadline: float) -> ssl.SSLSocket:
        """Run the server's handshake on a blocking ``sock`` by ``deadline`` (``time.monotonic()``).

        Raises:
            ssl.SSLError: the client has no certificate, or one the CA did not sign. OSError: the
                connection failed or the deadline passed (``TimeoutError``).
        """
        return _handshake(self.server.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), deadline)

    def dial(self, sock: socket.socket, deadline: float) -> ssl.SSLSocket:
        """Run the client's handshake on a blocking, connected ``sock`` by ``deadline``; raises like
        :meth:`accept` (a server whose certificate the CA did not sign: ``ssl.SSLCertVerificationError``)."""
        return _handshake(self.client.wrap_socket(sock, do_handshake_on_connect=False), deadline)

    def wrap_accepted(self, sock: socket.socket) -> ssl.SSLSocket:
        """``sock`` (non-blocking) as the server's end, its handshake left to ``do_handshake()`` calls
        from an event loop."""
        return self.server.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


@functools.lru_cache(maxsize=4)
def load(cert: str, key: str, ca: str) -> Tls:
    """Contexts that present ``cert`` (with its private ``key``) and require the peer's to be signed by ``ca``.

    Raises:
        ValueError: a file is missing or is not a PEM certificate or key (naming the variable).
    """
    return Tls(_context(ssl.PROTOCOL_TLS_SERVER, cert, key, ca), _context(ssl.PROTOCOL_TLS_CLIENT, cert, key, ca))


def _context(protocol: int, cert: str, key: str, ca: str) -> ssl.SSLContext:
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # ranks dial addresses; the CA is what vouches (module docstring)
    context.verify_mode = ssl.CERT_REQUIRED
    context.sslsocket_class = TlsSocket
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ALLREDUCE_TLS_CERT={cert!r} with ALLREDUCE_TLS_KEY={key!r}: {exc}") from exc
    try:
        context.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ALLREDUCE_TLS_CA={ca!r}: {exc}") from exc
    return context


def refused(exc: BaseException) -> bool:
    """Whether a failed connection is a TLS refusal (a certificate, or no TLS at the other end), which
    dialling again cannot mend, rather than a connection cut or reset."""
    return isinstance(exc, ssl.SSLError) and not isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError,
                                                                  ssl.SSLSyscallError))


def buffered(sock: socket.socket) -> int:
    """Bytes already decrypted and waiting in ``sock`` (always 0 for a plain socket): a poll cannot see them."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


def describe(exc: BaseException) -> str:
    """What a failed TLS handshake most likely means, for an error message."""
    text = str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the other end's certificate is not signed by ALLREDUCE_TLS_CA ({exc.verify_message})"
    if "unknown ca" in text or "certificate required" in text or "bad certificate" in text:
        return f"the other end refused this rank's certificate: it is not signed by its CA ({text})"
    if "wrong version number" in text or "record layer" in text or isinstance(exc, ssl.SSLEOFError):
        return (f"the other end does not speak TLS, or refused us ({text}); set the ALLREDUCE_TLS_* "
                f"variables on every rank or on none")
    return text


def _handshake(sock: ssl.SSLSocket, deadline: float) -> ssl.SSLSocket:
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.do_handshake()
    except BaseException:
        sock.close()
        raise
    return sock
