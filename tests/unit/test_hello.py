"""The transports' hellos as pure functions, without sockets: round trips, any split of the stream,
and every way a hello can be wrong (truncated, foreign magic, other group, other receiver, a sender
that may not dial)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allreduce.errors import ProtocolError
from allreduce.transport import hello
from allreduce.transport.tcp.peering import HELLO as TCP_HELLO
from allreduce.transport.shm import peering as shm_peering

DIGEST = hello.group_digest("g")
FORMATS = {"tcp": TCP_HELLO, "shm": shm_peering.HELLO}
ranks = st.integers(0, 2**31 - 1)


def _hello(fmt: hello.Format, sender: int, receiver: int, digest: bytes = DIGEST) -> hello.Hello:
    return hello.Hello(sender, receiver, digest, tuple(range(7, 7 + fmt.terms)))


def _for(receiver: int, senders=range(2**31)) -> hello.Expected:
    return hello.Expected(receiver, DIGEST, senders)


@pytest.mark.parametrize("kind", FORMATS)
@given(sender=ranks, receiver=ranks, terms=st.lists(st.integers(-2**63, 2**63 - 1), min_size=5, max_size=5))
def test_round_trip(kind, sender, receiver, terms):
    fmt = FORMATS[kind]
    sent = hello.Hello(sender, receiver, DIGEST, tuple(terms[:fmt.terms]))
    data = fmt.encode(sent)
    assert len(data) == fmt.size
    assert fmt.decode(data, _for(receiver)) == sent
    assert fmt.encode(fmt.decode(data, _for(receiver))) == data  # what authentication binds to


@pytest.mark.parametrize("kind", FORMATS)
@given(cuts=st.lists(st.integers(0, 64), max_size=6), extra=st.binary(max_size=8))
def test_stream_decoder_takes_any_split(kind, cuts, extra):
    fmt = FORMATS[kind]
    sent = _hello(fmt, 3, 1)
    data = fmt.encode(sent) + extra
    decoder = hello.Decoder(fmt, _for(1))
    at, got = 0, None
    for cut in sorted(cuts) + [len(data)]:
        got, rest = decoder.feed(data[at:max(at, cut)])
        at = max(at, cut)
        if got is not None:
            break
        assert decoder.missing == fmt.size - min(at, fmt.size)
    assert got == sent and rest == data[fmt.size:at]


@pytest.mark.parametrize("kind", FORMATS)
def test_truncated(kind):
    fmt = FORMATS[kind]
    data = fmt.encode(_hello(fmt, 3, 1))
    for n in range(fmt.size):
        with pytest.raises(ProtocolError, match="truncated"):
            fmt.decode(data[:n], _for(1))
        assert hello.Decoder(fmt, _for(1)).feed(data[:n]) == (None, b"")
    with pytest.raises(ProtocolError, match=f"{fmt.size + 1} bytes"):
        fmt.decode(data + b"x", _for(1))


@pytest.mark.parametrize("kind", FORMATS)
@given(junk=st.binary(min_size=1, max_size=4))
def test_wrong_magic_fails_on_its_first_bytes(kind, junk):
    fmt = FORMATS[kind]
    if fmt.magic.startswith(junk):
        return
    with pytest.raises(ProtocolError, match="not an allreduce peer"):
        hello.Decoder(fmt, _for(1)).feed(junk)


def test_one_transport_does_not_take_the_others_hello():
    data = TCP_HELLO.encode(_hello(TCP_HELLO, 3, 1))
    with pytest.raises(ProtocolError, match="starts with b'ARHI', not b'ARSM'"):
        shm_peering.HELLO.decode(data, _for(1))


@pytest.mark.parametrize("kind", FORMATS)
def test_wrong_group_receiver_or_sender(kind):
    fmt = FORMATS[kind]
    other = fmt.encode(_hello(fmt, 3, 1, hello.group_digest("h")))
    with pytest.raises(ProtocolError, match="another group"):
        fmt.decode(other, _for(1))
    with pytest.raises(ProtocolError, match="for rank 1, not rank 2"):
        fmt.decode(fmt.encode(_hello(fmt, 3, 1)), _for(2))
    with pytest.raises(ProtocolError, match="from rank 99, which is not a rank that dials rank 1"):
        fmt.decode(fmt.encode(_hello(fmt, 99, 1)), _for(1, range(2, 4)))
    with pytest.raises(ProtocolError, match="from rank 0"):  # lower ranks never dial up
        hello.Decoder(fmt, _for(1, range(2, 4))).feed(fmt.encode(_hello(fmt, 0, 1)))


@given(st.binary(max_size=64))
def test_junk_is_a_protocol_error_or_a_valid_hello(data):
    for fmt in FORMATS.values():
        try:
            got = fmt.decode(data, _for(1))
        except ProtocolError:
            continue
        assert fmt.encode(got) == data


def test_encode_refuses_a_malformed_record():
    with pytest.raises(ValueError, match=f"{shm_peering.HELLO.terms} terms"):
        shm_peering.HELLO.encode(hello.Hello(1, 0, DIGEST))
    with pytest.raises(ValueError, match="16-byte digest"):
        TCP_HELLO.encode(hello.Hello(1, 0, b"short"))
