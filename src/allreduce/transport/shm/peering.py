"""What travels over the Unix socket between two ranks of a host: the hello, then small notices.

Its own file because this is the protocol between two processes, apart from what either does with it.
At set-up (the shared-memory side of :mod:`..mesh`) the dialler and then the accepter each send a
hello with their control segment's descriptor alongside (``SCM_RIGHTS``); its terms are the layout of
channels and lines ``(chunk, slots, line_max, chunked_max, line_chunk)``, which both must share. Each
end first checks that the other runs as the same user (``SO_PEERCRED``): abstract sockets have no
permissions, so this keeps other users out. After that the socket carries only notices, each one message: a wake-up,
the descriptor of a registered segment, or "unmap that segment"; :func:`notice` reads one, whatever arrives.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import time
from dataclasses import dataclass

from ...errors import ProtocolError, RendezvousError
from .. import hello

HELLO = hello.Format(b"ARSM", terms=5)  # terms: the layout below
WAKE = b"W"
_SEGMENT = struct.Struct("<cq")  # b"F": a segment's generation, its descriptor alongside; b"D": unmap it
_UCRED = struct.Struct("3i")


def share_notice(gen: int) -> bytes:
    """The notice sent with the descriptor of registered segment ``gen``."""
    return _SEGMENT.pack(b"F", gen)


def unmap_notice(gen: int) -> bytes:
    """The notice that segment ``gen`` was freed: unmap it."""
    return _SEGMENT.pack(b"D", gen)


def notice(data: bytes, fds: list[int]) -> tuple[str, int]:
    """What one received message says: ``("share", gen)`` (take ``fds[0]``), ``("unmap", gen)``,
    ``("wake", 0)`` for a wake-up or anything else, or ``("end", 0)`` when the socket hung up."""
    if not data:
        return "end", 0
    if len(data) == _SEGMENT.size and data[:1] == b"F" and len(fds) == 1:
        return "share", _SEGMENT.unpack(data)[1]
    if len(data) == _SEGMENT.size and data[:1] == b"D":
        return "unmap", _SEGMENT.unpack(data)[1]
    return "wake", 0


@dataclass
class PeerSocket:
    """The Unix socket to a peer that passed the hello, before its channels are mapped: the socket, the
    peer's control segment descriptor, its pid."""

    sock: socket.socket
    fd: int
    pid: int

    def close(self) -> None:
        self.sock.close()
        os.close(self.fd)


class ShmPeering:
    """The shared-memory side of the mesh: abstract seqpacket sockets, hellos with descriptors."""

    kind = "shm"
    joining = "link over shared memory"
    knock = None  # a dead rank's listener is not probed: its dialler's error names it

    def __init__(self, rank: int, members: list[int], tag: str, layout: tuple[int, ...], fd: int):
        self.rank = rank
        self.members = members
        self.digest = hello.group_digest(tag)
        self.layout = layout  # (chunk, slots, line_max, chunked_max, line_chunk): channels, lines
        self.fd = fd  # our control segment

    def listen(self, backlog: int) -> tuple[socket.socket, str]:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        name = f"allreduce-{secrets.token_hex(12)}"
        listener.bind("\0" + name)
        listener.listen(backlog)
        return listener, name

    def dial(self, peer: int, address: str, deadline: float) -> PeerSocket:
        """Connect to lower rank ``peer`` and trade hellos and control segments."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        link = None
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.connect("\0" + address)
            if not _same_user(sock):
                raise ProtocolError(f"a process of another user listens at rank {peer}'s address")
            self._send_hello(sock, peer)
            theirs, fd = self._receive_hello(sock, (peer,))
            link = PeerSocket(sock, fd, _peer_pid(sock))
        except (OSError, ProtocolError) as exc:
            (link or sock).close()
            raise RendezvousError(f"rank {self.rank} could not link with rank {peer} over shared memory: "
                                  f"{exc}") from exc
        return self._agreed(link, peer, theirs.terms)

    def answer(self, sock: socket.socket, due: float) -> tuple[int, PeerSocket] | None:
        """Take a higher member's hello and answer it; ``None`` (closed) for a stranger.

        Raises:
            RendezvousError: a member whose channels are laid out differently.
        """
        link = None
        try:
            if not _same_user(sock):
                raise ProtocolError("another user")
            sock.settimeout(max(0.1, due - time.monotonic()))
            theirs, fd = self._receive_hello(sock, [m for m in self.members if m > self.rank])
            link = PeerSocket(sock, fd, _peer_pid(sock))
            self._send_hello(sock, theirs.sender)
        except (OSError, ProtocolError):
            (link or sock).close()
            return None
        return theirs.sender, self._agreed(link, theirs.sender, theirs.terms)

    def _send_hello(self, sock: socket.socket, peer: int) -> None:
        data = HELLO.encode(hello.Hello(self.rank, peer, self.digest, self.layout))
        socket.send_fds(sock, [data], [self.fd])

    def _receive_hello(self, sock: socket.socket, senders) -> tuple[hello.Hello, int]:
        """A hello to us from one of ``senders`` and the descriptor that came with it."""
        data, fds, _, _ = socket.recv_fds(sock, HELLO.size + 1, 2)
        try:
            greeting = HELLO.decode(data, hello.Expected(self.rank, self.digest, senders))
            if len(fds) != 1:
                raise ProtocolError(f"hello came with {len(fds)} descriptors, not its control segment")
        except ProtocolError:
            for fd in fds:
                os.close(fd)
            raise
        return greeting, fds[0]

    def _agreed(self, link: PeerSocket, peer: int, theirs: tuple[int, ...]) -> PeerSocket:
        """``link``, if the peer's channels are laid out as ours; ``RendezvousError`` (closed) if not."""
        if theirs != self.layout:
            link.close()
            raise RendezvousError(f"ranks {self.rank} and {peer} lay out shared-memory channels differently "
                                  f"((chunk, slots, line_max, chunked_max, line_chunk) {self.layout} and {theirs}): "
                                  f"give every rank the same ALLREDUCE_SHM_* settings")
        return link


def _same_user(sock: socket.socket) -> bool:
    """Whether the other end of a Unix socket runs as this user (a process of the same user could
    read our memory anyway)."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid == os.getuid()


def _peer_pid(sock: socket.socket) -> int:
    """The pid at the other end of a Unix socket, as the kernel saw it connect (0 if unknown here)."""
    pid, _, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid
