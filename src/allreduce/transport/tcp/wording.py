"""The words of a TCP link's errors, written once for every side that meets them: the collective
transport (:mod:`.transport`), the compiled TCP engine's Python side (``engines.native_tcp``) and
point-to-point (``p2p``)."""

from __future__ import annotations

from ... import wire
from ...errors import AllreduceError, CommTimeout, PeerLost, ProtocolError, with_peer


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
