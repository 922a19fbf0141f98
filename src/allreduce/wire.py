"""The frame format between peers, as pure functions: bytes in, headers out, no sockets.

Every message starts with a fixed 40-byte header that carries the collective's fingerprint (which
collective, its sequence number, dtype, op, element count and root), the step of the schedule and the
payload length. The receiver knows exactly which header it expects next from each peer, so comparing
the two catches mismatched calls (different sizes, dtypes, ops, roots or call order) on the first
frame, before a byte of payload lands in the user's buffer.

A DATA frame carries a segment of a collective. An ABORT frame carries the reason a peer gave up, so
the ranks that were waiting on it can say why instead of only "connection closed".
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from . import collectives
from .errors import Mismatch, ProtocolError

MAGIC = b"AR"
VERSION = 1

DATA = 1
ABORT = 2
KINDS = (DATA, ABORT)


_HEADER = struct.Struct("<2sBBBBBxiIQQQ")
HEADER_SIZE = _HEADER.size
MAX_ABORT_REASON = 4096


class Header(NamedTuple):
    """One frame's header; ``collective`` is a collective's code (:mod:`allreduce.collectives`), ``dtype`` a
    wire dtype code."""

    kind: int
    collective: int
    dtype: int
    op: int
    root: int
    step: int
    seq: int
    count: int
    nbytes: int


def encode(h: Header) -> bytes:
    """The 40 bytes that announce a frame."""
    return _HEADER.pack(MAGIC, VERSION, h.kind, h.collective, h.dtype, h.op, h.root, h.step, h.seq, h.count, h.nbytes)


def decode(buf) -> Header:
    """Parse a header; ``ProtocolError`` for anything that is not a frame of ours."""
    if len(buf) != HEADER_SIZE:
        raise ProtocolError(f"frame header must be {HEADER_SIZE} bytes, got {len(buf)}")
    magic, version, kind, coll, dtype, op, root, step, seq, count, nbytes = _HEADER.unpack(buf)
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
    return Header(kind, coll, dtype, op, root, step, seq, count, nbytes)


def abort_frame(reason: str) -> bytes:
    """A complete ABORT frame (header and reason) telling a peer why this rank gives up."""
    payload = reason.encode("utf-8", "replace")[:MAX_ABORT_REASON]
    return encode(Header(ABORT, 0, 0, 0, 0, 0, 0, 0, len(payload))) + payload


def check(expected: Header, got: Header) -> None:
    """Raise :class:`Mismatch` describing every field where ``got`` differs from ``expected``."""
    if got == expected:
        return
    from .dtypes import dtype_of
    from .ops import ReduceOp

    def show(h: Header, field: str) -> str:
        value = getattr(h, field)
        if field == "collective":
            return collectives.BY_CODE[value].name
        if field == "dtype":
            return str(dtype_of(value))
        if field == "op":
            try:
                return ReduceOp(value).name
            except ValueError:
                return str(value)
        return str(value)

    fields = ("collective", "seq", "count", "dtype", "op", "root", "step", "nbytes")
    diffs = [f"{f} {show(got, f)} (expected {show(expected, f)})" for f in fields if getattr(got, f) != getattr(expected, f)]
    raise Mismatch("peer called a different collective or arguments: it sent " + ", ".join(diffs))
