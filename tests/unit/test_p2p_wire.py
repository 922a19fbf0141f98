"""Point-to-point frames as pure encode/decode pairs: envelopes, control frames, and what is refused."""

from __future__ import annotations

import pytest

from allreduce import collectives, wire
from allreduce.errors import Mismatch, ProtocolError


def test_an_eager_envelope_carries_tag_number_and_size():
    header = wire.decode(wire.message(tag=7, number=(1 << 32) + 3, dtype=10, count=5, nbytes=20))
    assert (header.kind, header.step, header.root, header.seq, header.dtype, header.count, header.nbytes) == \
        (wire.MESSAGE, wire.EAGER, 7, 3, 10, 5, 20)
    assert header.collective == collectives.get("send").code


def test_an_announced_envelope_is_followed_by_the_payload_address():
    frame = wire.message(tag=1, number=2, dtype=3, count=1 << 40, nbytes=(1 << 40) * 2, where=0x7F0012345678)
    header = wire.decode(frame[:wire.HEADER_SIZE])
    assert (header.step, header.count, header.nbytes) == (wire.ANNOUNCED, 1 << 40, wire.WHERE.size)
    assert wire.WHERE.unpack(frame[wire.HEADER_SIZE:]) == (0x7F0012345678,)


@pytest.mark.parametrize("kind", [wire.CLEAR, wire.TAKEN, wire.PAYLOAD])
def test_control_frames_name_their_message(kind):
    header = wire.decode(wire.control(kind, number=9, nbytes=100))
    assert (header.kind, header.seq, header.nbytes) == (kind, 9, 100 if kind == wire.PAYLOAD else 0)


def test_credit_and_ident():
    assert wire.decode(wire.control(wire.CREDIT, nbytes=4096)).count == 4096
    assert wire.decode(wire.control(wire.IDENT)).nbytes == wire.IDENTITY.size


def test_malformed_point_to_point_frames_are_refused():
    announced = wire.Header(wire.MESSAGE, collectives.get("send").code, 0, 0, 0, wire.ANNOUNCED, 1, 1, 5)
    with pytest.raises(ProtocolError, match="envelope"):
        wire.decode(wire.encode(announced))  # an announced envelope carries exactly an address
    with pytest.raises(ProtocolError, match="collective code"):
        wire.decode(wire.encode(announced._replace(collective=0, nbytes=8)))


def test_a_point_to_point_frame_where_a_collective_frame_was_expected_is_a_mismatch():
    expected = wire.Header(wire.DATA, 0, 10, 0, 0, 1, 4, 16, 64)
    got = wire.decode(wire.control(wire.CLEAR, number=4))
    with pytest.raises(Mismatch, match="kind CLEAR \\(expected DATA\\)"):
        wire.check(expected, got)
