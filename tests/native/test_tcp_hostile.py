"""Hostile bytes at the compiled TCP engine: nothing a peer sends can crash it or hang it.

A plan that expects one frame (copied, or reduced through staging) reads from one end of a socket
pair while the test writes at the other: random bytes, headers cut short, headers of the wrong
size, ABORTs whose reason is cut or claims more than the limit, a right header with too little
payload, then the link closed or left open. Every run must come back with a failure the Python
side can word (a header, an ABORT, a lost link, a deadline) or, for the one right frame, with the
payload in place. A peer that sends its ABORT and then resets the link is heard as the ABORT, whether
the step sends to it, receives from it or both. The frame parser alone runs for a few seconds under
libFuzzer (``make fuzz-frames``).
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allreduce import collectives, wire

tcp = pytest.importorskip("allreduce.native._tcp", reason="the compiled engine is not built")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COUNT, SEQ = 6, 41  # float32 elements the plan expects, and the run's sequence number
EXPECTED = wire.Header(wire.DATA, collectives.get("all_reduce").code, 11, 0, 0, 0, SEQ, COUNT, COUNT * 4, 5)
FAILURES = {tcp.RUN_HEADER, tcp.RUN_ABORT, tcp.RUN_LOST, tcp.RUN_TIMEOUT}


def _plan(reduce: bool):
    """A plan of one step: receive COUNT float32 from rank 1 into data (or reduced into it through tmp)."""
    acc, stage = (0, 2) if reduce else (-1, -1)
    words = [1, 0, 0, 0, 1, 1, 0, 0, COUNT * 4, acc, 0, stage, 0]
    return struct.pack(f"<{len(words)}q", *words)


def _run(data: bytes, close: bool, reduce: bool):
    """What a run of the one-frame plan returns while ``data`` arrives (then the link closes, if ``close``)."""
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    try:
        template = wire.encode(EXPECTED._replace(seq=0, nbytes=0))
        plan = tcp.Plan([-1, mine.fileno()], _plan(reduce), template, 3, 4, 0, 11, lambda *args: None)
        plan.bind((np.zeros(COUNT, np.float32),))
        theirs.sendall(data)
        if close:
            theirs.shutdown(socket.SHUT_WR)
        out = np.ones(COUNT, np.float32)
        return plan.run({"data": out}, SEQ, 0.1, None, 1.0), out
    finally:
        mine.close()
        theirs.close()


def _check(data: bytes, close: bool, reduce: bool) -> None:
    why, out = _run(data, close, reduce)
    if why is None:  # only the expected frame completes the run (its padding byte aside, as in Python)
        assert wire.decode(data[:wire.HEADER_SIZE]) == EXPECTED and len(data) >= wire.HEADER_SIZE + COUNT * 4
        payload = np.frombuffer(data[wire.HEADER_SIZE:wire.HEADER_SIZE + COUNT * 4], np.float32)
        assert out.tobytes() == (payload + 1 if reduce else payload).tobytes()
        return
    status, step, peer, detail, half_sent = why
    assert status in FAILURES and step == 0 and peer == 1 and half_sent == []
    if status == tcp.RUN_ABORT:
        assert isinstance(detail, bytes) and len(detail) <= wire.MAX_ABORT_REASON
    if status == tcp.RUN_HEADER:
        got, want = detail
        assert want == wire.encode(EXPECTED) and got == data[:wire.HEADER_SIZE]


def _frames():
    good = wire.encode(EXPECTED)
    abort = wire.abort_frame("peer gave up")
    huge = bytearray(abort[:wire.HEADER_SIZE])
    huge[32:40] = struct.pack("<Q", 1 << 62)
    return st.one_of(
        st.binary(max_size=200),  # anything
        st.integers(0, wire.HEADER_SIZE).map(lambda n: good[:n]),  # a header cut short
        st.integers(0, COUNT * 4).map(lambda n: good + bytes(n)),  # too little payload
        st.integers(0, len(abort)).map(lambda n: abort[:n]),  # an ABORT cut anywhere
        st.just(bytes(huge) + b"x" * 10),  # an ABORT that claims a reason beyond the limit
        st.binary(min_size=1, max_size=8).map(lambda b: good[:-8] + b.ljust(8, b"\0")),  # wrong nbytes
        st.builds(lambda at, v: good[:at] + bytes([v]) + good[at + 1:] + bytes(COUNT * 4),
                  st.integers(0, wire.HEADER_SIZE - 1), st.integers(0, 255)),  # one byte changed
    )


@settings(max_examples=250, deadline=None)
@given(_frames(), st.booleans(), st.booleans())
def test_hostile_frames_on_a_socket_fail_cleanly(data, close, reduce):
    _check(data, close, reduce)


def test_the_expected_frame_lands_in_place_or_reduced():
    payload = np.arange(COUNT, dtype=np.float32)
    frame = wire.encode(EXPECTED) + payload.tobytes()
    assert _run(frame, False, False)[0] is None and _run(frame, False, False)[1].tolist() == payload.tolist()
    why, out = _run(frame, False, True)
    assert why is None and out.tolist() == (payload + 1).tolist()


def test_an_abort_comes_back_with_its_reason():
    why, _ = _run(wire.abort_frame("rank 1 ran out of memory"), True, False)
    assert why[0] == tcp.RUN_ABORT and why[3] == b"rank 1 ran out of memory"


@pytest.mark.parametrize("piece", [4093, 65537])
def test_a_segment_larger_than_the_staging_ring_arriving_in_pieces_is_reduced_whole(piece):
    """The reducing receive folds through a ring of STAGE_RING bytes: pieces that end anywhere (mid-element
    too) and a segment that is laps and a part of the ring must still reduce every element once."""
    count = (tcp.STAGE_RING * 5) // 4 + 3  # float32 elements: five laps of the ring and a part
    header = wire.encode(EXPECTED._replace(count=count, nbytes=count * 4))
    words = [1, 0, 0, 0, 1, 1, 0, 0, count * 4, 0, 0, 2, 0]
    mine, theirs = socket.socketpair()
    try:
        plan = tcp.Plan([-1, mine.fileno()], struct.pack(f"<{len(words)}q", *words),
                        wire.encode(EXPECTED._replace(seq=0, nbytes=0, count=count)), 3, 4, 0, 11, lambda *args: None)
        plan.bind((np.zeros(tcp.STAGE_RING, np.uint8),))  # the ring, no more: a wrap past it is refused
        mine.setblocking(False)
        payload = np.arange(count, dtype=np.float32) % 1000
        frame = header + payload.tobytes()
        out = np.full(count, 0.5, np.float32)
        outcome = []
        reader = threading.Thread(target=lambda: outcome.append(plan.run({"data": out}, SEQ, 30.0, None, 1.0)))
        reader.start()
        for at in range(0, len(frame), piece):
            theirs.sendall(frame[at:at + piece])
            time.sleep(0.0002)  # the reader takes each piece alone, mostly
        reader.join(60)
        assert outcome == [None]
        assert out.tobytes() == (payload + np.float32(0.5)).tobytes()
    finally:
        mine.close()
        theirs.close()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (a reset needs TCP: a socket pair only ends)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        mine = socket.create_connection(server.getsockname())
        theirs, _ = server.accept()
    return mine, theirs


@pytest.mark.parametrize("sends,receives", [(True, False), (False, True), (True, True)])
def test_an_abort_before_a_reset_wins_over_the_reset(sends, receives):
    """The peer sends its ABORT and resets the link (closes with unread data, or SO_LINGER 0, as a rank
    that exits on its error may) before this rank's step sends or receives: the ABORT is the failure."""
    words = [1, 0, 0, int(sends), int(receives)]
    words += [1, 0, 0, COUNT * 4] if sends else []
    words += [1, 0, 0, COUNT * 4, -1, 0, -1, 0] if receives else []
    mine, theirs = _tcp_pair()
    try:
        template = wire.encode(EXPECTED._replace(seq=0, nbytes=0))
        plan = tcp.Plan([-1, mine.fileno()], struct.pack(f"<{len(words)}q", *words), template, 3, 4, 0, 11,
                        lambda *args: None)
        plan.bind((np.zeros(COUNT, np.float32),))
        theirs.sendall(wire.abort_frame("rank 1 gave up"))
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        theirs.close()  # a reset, after the ABORT's bytes
        mine.setblocking(False)
        why = plan.run({"data": np.ones(COUNT, np.float32)}, SEQ, 5.0, None, 1.0)
        assert why is not None and why[:4] == (tcp.RUN_ABORT, 0, 1, b"rank 1 gave up"), why
    finally:
        mine.close()
        theirs.close()


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed: `make fuzz-frames` needs it")
def test_the_parser_survives_a_few_seconds_of_libfuzzer():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # `make asan` preloads gcc's ASan, not clang's
    done = subprocess.run(["make", "-s", "fuzz-frames", "FUZZ_SECONDS=5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Done" in done.stderr and "ERROR" not in done.stderr
