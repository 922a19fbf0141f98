"""Where everything lies in a control segment: the header words, the channels, the slots.

One place for the offsets, so the rank that writes a word and the rank that reads it cannot disagree.
A control segment starts with header words (8 bytes each) and the abort reason, then one channel per
member of the host. A channel is two counters, each on its own cache line (``SENT``, written only by
the segment's owner, and ``TAKEN``, written only by the peer), then a ring of slots. A slot is the
frame header, a few descriptor words, then up to ``chunk`` bytes of payload.

After the channels come the owner's two *lines* (:mod:`.lines`), the small-message path: a cache line
holding the owner's sleeping flag and the times of its last post and return, then per line a head (the call's number,
its group sequence number, its fingerprint and frame header) and up to ``line_max`` bytes of payload.
"""

from __future__ import annotations

import os

from ... import wire
from .. import shmseg

# Header words, as indices into the segment's 8-byte words.
MAGIC, PID, ADDRESS, STATE, SLEEPING, REASON_LEN, UNMAPS = range(7)
MAGIC_VALUE = int.from_bytes(b"ARSHMSEG", "little")
OPEN, CLOSED, ABORTED = 0, 1, 2  # values of the STATE word
REASON_AT = 64  # bytes; the abort reason follows the header words
CHANNELS_AT = REASON_AT + wire.MAX_ABORT_REASON + 64

# Channel: byte offsets of its two counters and of its first slot.
SENT, TAKEN, SLOTS_AT = 0, 64, 128

# Slot: descriptor words after the frame header (indices from the slot's first word), then the payload.
MODE, NBYTES, OFFSET, WHERE = range(wire.HEADER_SIZE // 8, wire.HEADER_SIZE // 8 + 4)
PAYLOAD_AT = 128
INLINE, REGISTERED, CROSS = 1, 2, 3  # values of the MODE word: how the payload travels


# Lines: the sleeping flag's word, then the times (CLOCK_MONOTONIC nanoseconds, written by the compiled
# engine) of the owner's last post and of its last return from a call: a waiting peer stays awake for a
# rank inside its call or just out of one. From the lines area's first word; per line, head words and payload.
LINE_SLEEPING, LINE_POSTED, LINE_RETURNED = 0, 1, 2
LINES_FIRST = 64  # bytes from the lines area to its first line
LINE_NUMBER, LINE_CALL, LINE_PRINT = range(3)  # head words: round number (written last), group seq, fingerprint
LINE_HEADER_AT = 24  # bytes from a line's start to its frame header
LINE_PAYLOAD_AT = 64


def line_size(line_max: int) -> int:
    """Bytes of one line carrying up to ``line_max`` payload bytes (whole cache lines)."""
    return LINE_PAYLOAD_AT + -(-line_max // 64) * 64


def lines_size(line_max: int) -> int:
    """Bytes of a rank's lines area: its sleeping flag and two lines."""
    return LINES_FIRST + 2 * line_size(line_max)


def slot_size(chunk: int) -> int:
    """Bytes of one slot that carries up to ``chunk`` payload bytes."""
    return PAYLOAD_AT + chunk


def channel_size(chunk: int, slots: int) -> int:
    """Bytes of one channel: its counters and ``slots`` slots."""
    return SLOTS_AT + slots * slot_size(chunk)


def create_control(members: int, channel: int, lines: int) -> shmseg.Segment:
    """A control segment of this process with ``members`` channels of ``channel`` bytes and ``lines``
    bytes of lines after them (:func:`lines_at`), header filled in."""
    segment = shmseg.create(lines_at(members, channel) + lines, "control")
    with memoryview(segment.map) as whole, whole.cast("q") as words:
        words[MAGIC], words[PID], words[ADDRESS] = MAGIC_VALUE, os.getpid(), segment.address
    return segment


def lines_at(members: int, channel: int) -> int:
    """Byte offset of the lines area in a control segment with ``members`` channels of ``channel`` bytes."""
    return -(-(CHANNELS_AT + members * channel) // 64) * 64


def write_reason(data: memoryview, words: memoryview, reason: str) -> None:
    """Store an abort reason (cut to ``wire.MAX_ABORT_REASON`` bytes of UTF-8) in a segment."""
    raw = reason.encode("utf-8", "replace")[:wire.MAX_ABORT_REASON]
    data[REASON_AT:REASON_AT + len(raw)] = raw
    words[REASON_LEN] = len(raw)


def read_reason(data: memoryview, words: memoryview) -> str:
    """The abort reason stored in a segment, ``"no reason given"`` if it is empty."""
    length = min(words[REASON_LEN], wire.MAX_ABORT_REASON)
    return bytes(data[REASON_AT:REASON_AT + length]).decode("utf-8", "replace") or "no reason given"
