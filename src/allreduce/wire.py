"""The frame format between peers, as pure functions: bytes in, headers out, no sockets.

Every message starts with a fixed 40-byte header that carries the collective's fingerprint (which
collective, its sequence number, dtype, op, element count and root, and a digest of the algorithm and
options its schedule was built from), the step of the schedule and the payload length. The receiver
knows exactly which header it expects next from each peer, so comparing the two catches mismatched
calls (different sizes, dtypes, ops, roots, algorithms or call order) on the first frame, before a
byte of payload lands in the user's buffer: two schedules can exchange frames of the same sizes in
the same steps and still compute different things.

A DATA frame carries a segment of a collective. An ABORT frame carries the reason a peer gave up, so
the ranks that were waiting on it can say why instead of only "connection closed".

Point-to-point messages (:mod:`allreduce.p2p`) use the same header on their own links, with more
kinds: MESSAGE (an envelope: ``root`` is the tag, ``seq`` the message's number from this sender,
``dtype``/``count`` its elements; ``step`` says whether its payload follows at once, EAGER, or waits
for the receiver, ANNOUNCED, with the 8-byte address of the payload in the sender), PAYLOAD (an
announced message's bytes, once cleared), IDENT (the sender's process id and where a token lies in
its memory, so that a receiver on the same host can read payloads straight out of it), and from the
receiver back to the sender CLEAR (send announced message ``seq`` now), TAKEN (announced message
``seq`` was read out of the sender's memory) and CREDIT (``count`` bytes of the receiver's space for
early messages are free again). See :func:`message` and :func:`control`.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from . import collectives
from .errors import Mismatch, ProtocolError

MAGIC = b"AR"
VERSION = 2

DATA = 1
ABORT = 2
MESSAGE = 3  # point-to-point: a message's envelope, and its payload if EAGER
PAYLOAD = 4  # point-to-point: the payload of an ANNOUNCED message, after the receiver's CLEAR
CLEAR = 5  # point-to-point, receiver to sender: send the payload of announced message ``seq``
CREDIT = 6  # point-to-point, receiver to sender: ``count`` bytes of space for early messages are free
IDENT = 7  # point-to-point, first on a link: the sender's pid and a token's address and bytes
TAKEN = 8  # point-to-point, receiver to sender: announced message ``seq`` was read out of the sender's memory
P2P_KINDS = (MESSAGE, PAYLOAD, CLEAR, CREDIT, IDENT, TAKEN)
KINDS = (DATA, ABORT, *P2P_KINDS)
_KIND_NAMES = {DATA: "DATA", ABORT: "ABORT", MESSAGE: "MESSAGE", PAYLOAD: "PAYLOAD", CLEAR: "CLEAR", CREDIT: "CREDIT",
               IDENT: "IDENT", TAKEN: "TAKEN"}
EAGER, ANNOUNCED = 0, 1  # a MESSAGE's ``step``: its payload follows, or waits for a CLEAR
WHERE = struct.Struct("<Q")  # an ANNOUNCED message's payload: the address of its data in the sender
IDENTITY = struct.Struct("<QQ16s")  # an IDENT frame's payload: pid, token address, token


_HEADER = struct.Struct("<2sBBBBBxiIIIQQ")
HEADER_SIZE = _HEADER.size
MAX_ABORT_REASON = 4096
SEQ_MODULUS = 1 << 32  # the header carries sequence numbers modulo this
_SEND = collectives.get("send").code  # the collective code point-to-point frames carry
_LABELS: dict[int, str] = {}  # algorithm digest -> its label, to name a peer's algorithm in a mismatch


class Header(NamedTuple):
    """One frame's header; ``collective`` is a collective's code (:mod:`allreduce.collectives`), ``dtype`` a
    wire dtype code, ``seq`` modulo :data:`SEQ_MODULUS`, ``algorithm`` an :func:`algorithm_digest`."""

    kind: int
    collective: int
    dtype: int
    op: int
    root: int
    step: int
    seq: int
    count: int
    nbytes: int
    algorithm: int = 0


def encode(h: Header) -> bytes:
    """The 40 bytes that announce a frame."""
    return _HEADER.pack(MAGIC, VERSION, h.kind, h.collective, h.dtype, h.op, h.root, h.step, h.seq, h.algorithm,
                        h.count, h.nbytes)


def decode(buf) -> Header:
    """Parse a header; ``ProtocolError`` for anything that is not a frame of ours."""
    if len(buf) != HEADER_SIZE:
        raise ProtocolError(f"frame header must be {HEADER_SIZE} bytes, got {len(buf)}")
    magic, version, kind, coll, dtype, op, root, step, seq, algorithm, count, nbytes = _HEADER.unpack(buf)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} (not an allreduce peer?)")
    if version != VERSION:
        raise ProtocolError(f"peer speaks frame version {version}, this rank speaks {VERSION}")
    if kind not in KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if kind == ABORT and nbytes > MAX_ABORT_REASON:
        raise ProtocolError(f"abort frame of {nbytes} bytes exceeds {MAX_ABORT_REASON}")
    if kind == DATA and coll not in collectives.BY_CODE:
        raise ProtocolError(f"unknown collective code {coll}")
    if kind in P2P_KINDS and coll != _SEND:
        raise ProtocolError(f"point-to-point frame of kind {kind} with collective code {coll}")
    if kind == MESSAGE and (step not in (EAGER, ANNOUNCED) or (step == ANNOUNCED and nbytes != WHERE.size)):
        raise ProtocolError(f"point-to-point envelope with step {step} and {nbytes} payload bytes")
    if kind == IDENT and nbytes != IDENTITY.size:
        raise ProtocolError(f"point-to-point identity of {nbytes} bytes, not {IDENTITY.size}")
    return Header(kind, coll, dtype, op, root, step, seq, count, nbytes, algorithm)


def abort_frame(reason: str) -> bytes:
    """A complete ABORT frame (header and reason) telling a peer why this rank gives up."""
    payload = reason.encode("utf-8", "replace")[:MAX_ABORT_REASON]
    return encode(Header(ABORT, 0, 0, 0, 0, 0, 0, 0, len(payload))) + payload


def message(tag: int, number: int, dtype: int, count: int, nbytes: int, where: int | None = None) -> bytes:
    """The envelope of point-to-point message ``number`` (modulo :data:`SEQ_MODULUS`) from this sender:
    ``count`` elements of wire dtype ``dtype``, ``nbytes`` in all, sent with ``tag``. Without ``where``
    it is EAGER (the payload follows); with it, ANNOUNCED: ``where``, the payload's address in the
    sender, follows, and the payload itself after the receiver's CLEAR (or never, if it is TAKEN)."""
    if where is None:
        return encode(Header(MESSAGE, _SEND, dtype, 0, tag, EAGER, number % SEQ_MODULUS, count, nbytes))
    return encode(Header(MESSAGE, _SEND, dtype, 0, tag, ANNOUNCED, number % SEQ_MODULUS, count,
                         WHERE.size)) + WHERE.pack(where)


def control(kind: int, number: int = 0, nbytes: int = 0) -> bytes:
    """A point-to-point frame without an envelope: PAYLOAD (``nbytes`` of message ``number`` follow),
    CLEAR or TAKEN of message ``number``, CREDIT of ``nbytes``, or IDENT (its payload follows)."""
    if kind == CREDIT:
        return encode(Header(CREDIT, _SEND, 0, 0, 0, 0, 0, nbytes, 0))
    if kind == IDENT:
        return encode(Header(IDENT, _SEND, 0, 0, 0, 0, 0, 0, IDENTITY.size))
    return encode(Header(kind, _SEND, 0, 0, 0, 0, number % SEQ_MODULUS, 0, nbytes if kind == PAYLOAD else 0))


def algorithm_digest(label: str, detail: str = "") -> int:
    """The header's ``algorithm`` field for a schedule built by ``label`` (an algorithm and its options,
    e.g. ``"tree(chunk=16384)"``) with ``detail`` (what else shaped it, e.g. the hosts).

    Remembered, so that a mismatch can name the peer's algorithm rather than a number.
    """
    digest = zlib.crc32(f"{label}|{detail}".encode())
    _LABELS[digest] = label
    return digest


def algorithm_label(digest: int) -> str:
    """The label :func:`algorithm_digest` made ``digest`` from, or ``digest`` in hex if this process never did."""
    return _LABELS.get(digest) or f"{digest:#010x}"


def check(expected: Header, got: Header) -> None:
    """Raise :class:`Mismatch` describing every field where ``got`` differs from ``expected``."""
    if got == expected:
        return
    from .dtypes import dtype_of
    from .ops import ReduceOp

    def show(h: Header, field: str) -> str:
        value = getattr(h, field)
        if field == "kind":
            return _KIND_NAMES.get(value, str(value))
        if field == "collective":
            return collectives.BY_CODE[value].name
        if field == "dtype":
            return str(dtype_of(value))
        if field == "algorithm":
            return algorithm_label(value)
        if field == "op":
            try:
                return ReduceOp(value).name
            except ValueError:
                return str(value)
        return str(value)

    fields = ("kind", "collective", "seq", "count", "dtype", "op", "root", "algorithm", "step", "nbytes")
    diffs = [f"{f} {show(got, f)} (expected {show(expected, f)})"
             for f in fields if getattr(got, f) != getattr(expected, f)]
    raise Mismatch("peer called a different collective or arguments: it sent " + ", ".join(diffs))
