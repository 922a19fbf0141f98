"""The hello that opens every link between two ranks, as pure functions: a record in, bytes out, and back.

It exists so that a rank that accepts a connection can tell, before it spends anything on it, whether
the other end is the peer it waits for: a rank of the same group (the digest of the group's tag),
dialling this very rank, from a rank allowed to dial it. No sockets here (h11's idea): the transports
read and write the bytes; the tests fuzz this without them.

A hello is ``magic (4s) | sender (i32) | receiver (i32) | group digest (16s) | terms (i64 each)``,
little-endian. Each transport has its own magic and number of *terms*, numbers both ends must agree
on (shared memory sends its channel layout). Anything else is a :class:`ProtocolError` saying what
was wrong.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Container
from dataclasses import dataclass

from ..errors import ProtocolError

DIGEST_SIZE = 16


def group_digest(tag: str) -> bytes:
    """The 16 bytes that stand for the group ``tag`` in a hello."""
    return hashlib.blake2b(tag.encode(), digest_size=DIGEST_SIZE).digest()


@dataclass(frozen=True)
class Hello:
    """Rank ``sender`` of the group ``digest`` wants a link with rank ``receiver``."""

    sender: int
    receiver: int
    digest: bytes
    terms: tuple[int, ...] = ()  # what both ends must agree on; as many as the format has


@dataclass(frozen=True)
class Expected:
    """What a hello must say to be taken by rank ``receiver`` of group ``digest``."""

    receiver: int
    digest: bytes
    senders: Container[int]  # the ranks that may dial ``receiver``


class Format:
    """One transport's hello: its magic and how many terms follow the common part.

    Example::

        TCP = Format(b"ARHI")
        data = TCP.encode(Hello(1, 0, group_digest("g")))
        TCP.decode(data, Expected(0, group_digest("g"), range(1, 2)))  # -> Hello(1, 0, ...)
    """

    def __init__(self, magic: bytes, terms: int = 0):
        self.magic = magic
        self.terms = terms
        self._struct = struct.Struct("<4sii16s" + "q" * terms)
        self.size = self._struct.size

    def encode(self, hello: Hello) -> bytes:
        """The bytes of ``hello``; ``ValueError`` if it has the wrong number of terms or digest size."""
        if len(hello.terms) != self.terms or len(hello.digest) != DIGEST_SIZE:
            raise ValueError(f"a {self.magic!r} hello has {self.terms} terms and a {DIGEST_SIZE}-byte digest, "
                             f"got {hello}")
        return self._struct.pack(self.magic, hello.sender, hello.receiver, hello.digest, *hello.terms)

    def decode(self, data: bytes, expected: Expected) -> Hello:
        """The hello in ``data`` (exactly one), checked against ``expected``.

        Raises:
            ProtocolError: naming what was wrong: length, magic, group, receiver or sender.
        """
        self.check_start(data)
        if len(data) != self.size:
            raise ProtocolError(f"hello is {len(data)} bytes, expected {self.size}"
                                + (" (truncated)" if len(data) < self.size else ""))
        magic, sender, receiver, digest, *terms = self._struct.unpack(data)
        if digest != expected.digest:
            raise ProtocolError("hello is for another group (its tag differs)")
        if receiver != expected.receiver:
            raise ProtocolError(f"hello is for rank {receiver}, not rank {expected.receiver}")
        if sender not in expected.senders:
            raise ProtocolError(f"hello from rank {sender}, which is not a rank that dials rank {receiver} "
                                f"in this group")
        return Hello(sender, receiver, digest, tuple(terms))

    def check_start(self, data: bytes) -> None:
        """``ProtocolError`` unless ``data`` could be the start of a hello (its magic, or a prefix of it)."""
        start = bytes(data[:len(self.magic)])
        if not self.magic.startswith(start):
            raise ProtocolError(f"hello starts with {start!r}, not {self.magic!r} (not an allreduce peer?)")


class Decoder:
    """Reads one hello off a byte stream, in pieces of any size; a wrong magic fails at once.

    Example::

        decoder = Decoder(TCP, expected)
        while (hello := decoder.feed(sock.recv(decoder.missing))[0]) is None: ...
    """

    def __init__(self, fmt: Format, expected: Expected):
        self._format = fmt
        self._expected = expected
        self._got = bytearray()

    @property
    def missing(self) -> int:
        """Bytes still needed to complete the hello."""
        return self._format.size - len(self._got)

    def feed(self, data: bytes) -> tuple[Hello | None, bytes]:
        """Take bytes; ``(None, b"")`` while more is needed, then ``(hello, rest)``, ``rest`` being what
        followed it.

        Raises:
            ProtocolError: as :meth:`Format.decode`; the magic is checked as soon as its bytes are in.
        """
        need = self.missing
        self._got += data[:need]
        if len(self._got) < self._format.size:
            self._format.check_start(self._got)
            return None, b""
        return self._format.decode(bytes(self._got), self._expected), bytes(data[need:])
