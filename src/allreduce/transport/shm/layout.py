"""Where everything lies in a control segment: the header words, the channels, the slots.

One place for the offsets, so the rank that writes a word and the rank that reads it cannot disagree.
A control segment starts with header words (8 bytes each) and the abort reason, then one channel per
member of the host. A channel is two counters, each on its own cache line (``SENT``, written only by
the segment's owner, and ``TAKEN``, written only by the peer), then a ring of slots. A slot is the
frame header, a few descriptor words, then up to ``chunk`` bytes of payload.
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


def slot_size(chunk: int) -> int:
    """Bytes of one slot that carries up to ``chunk`` payload bytes."""
    return PAYLOAD_AT + chunk


def channel_size(chunk: int, slots: int) -> int:
    """Bytes of one channel: its counters and ``slots`` slots."""
    return SLOTS_AT + slots * slot_size(chunk)


def create_control(members: int, channel: int) -> shmseg.Segment:
    """A control segment of this process with ``members`` channels of ``channel`` bytes, header filled in."""
    segment = shmseg.create(CHANNELS_AT + members * channel, "control")
    with memoryview(segment.map) as whole, whole.cast("q") as words:
        words[MAGIC], words[PID], words[ADDRESS] = MAGIC_VALUE, os.getpid(), segment.address
    return segment


def write_reason(data: memoryview, words: memoryview, reason: str) -> None:
    """Store an abort reason (cut to ``wire.MAX_ABORT_REASON`` bytes of UTF-8) in a segment."""
    raw = reason.encode("utf-8", "replace")[:wire.MAX_ABORT_REASON]
    data[REASON_AT:REASON_AT + len(raw)] = raw
    words[REASON_LEN] = len(raw)


def read_reason(data: memoryview, words: memoryview) -> str:
    """The abort reason stored in a segment, ``"no reason given"`` if it is empty."""
    length = min(words[REASON_LEN], wire.MAX_ABORT_REASON)
    return bytes(data[REASON_AT:REASON_AT + length]).decode("utf-8", "replace") or "no reason given"
