"""The compiled schedule engine over TCP (engines/native_tcp.py, native/_tcp.c).

Pure: the C frame parser agrees with :func:`allreduce.wire.decode` on any bytes and never crashes;
a malformed program or a buffer too small for it is refused before anything moves.

Processes: groups whose ranks run different engines (even ranks compiled, odd ranks Python) give the
numpy reference's results for every collective, dtype, op, awkward count and world sizes 1 to 5,
so both engines put the same frames on the wire; a mismatch, a rank that gives up, a dead rank, a
deadline and a signal give the same errors, word for word, on either engine.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import ssl
import struct
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.harness import free_port, run_ranks
from support.matrices import all_reduce_matrix, block_matrix, rooted_matrix

import allreduce as dist
from allreduce import collectives, wire
from allreduce.engines import NativeTcpEngine, ScheduleEngine
from allreduce.runtime.choice import schedule_engine
from allreduce.errors import ProtocolError
from allreduce.settings import Settings
from allreduce.transport.tcp import TcpTransport

tcp = pytest.importorskip("allreduce.native._tcp", reason="the compiled engine is not built")

HEADER = wire.encode(wire.Header(wire.DATA, collectives.get("all_reduce").code, 11, 0, 3, 2, 99, 1000, 4000, 77))


# ---- the parser ---------------------------------------------------------------------------------

def _agrees(data: bytes) -> None:
    parsed = tcp.parse_header(data)
    try:
        header = wire.decode(data)
    except ProtocolError:
        return  # C may accept what only Python's tables refuse (collective codes), never the reverse
    assert parsed == tuple(header[:5]) + (header.step, header.seq, header.algorithm, header.count, header.nbytes)


@settings(max_examples=3000, deadline=None)
@given(st.binary(min_size=0, max_size=96))
def test_any_bytes_parse_or_are_refused(data):
    _agrees(data)
    assert isinstance(tcp.parse_header(data), (tuple, int))


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.tuples(st.integers(0, wire.HEADER_SIZE - 1), st.integers(0, 255)), max_size=6))
def test_headers_with_bytes_changed_parse_as_python_does(changes):
    data = bytearray(HEADER)
    for at, value in changes:
        data[at] = value
    _agrees(bytes(data))


def test_parser_refusals_name_the_reason():
    abort = bytearray(wire.abort_frame("x")[:wire.HEADER_SIZE])
    abort[32:40] = struct.pack("<Q", wire.MAX_ABORT_REASON + 1)
    assert tcp.parse_header(HEADER[:-1]) == 1
    assert tcp.parse_header(b"XX" + HEADER[2:]) == 2
    assert tcp.parse_header(HEADER[:2] + b"\x09" + HEADER[3:]) == 3
    assert tcp.parse_header(HEADER[:3] + b"\x00" + HEADER[4:]) == 4
    assert tcp.parse_header(bytes(abort)) == 5
    assert tcp.parse_header(wire.abort_frame("x")[:wire.HEADER_SIZE])[0] == wire.ABORT


# ---- plans ----------------------------------------------------------------------------------------

def _plan(words, fds=(-1, 0), buffers=4):
    program = struct.pack(f"<{len(words)}q", *words)
    return tcp.Plan(list(fds), program, HEADER, buffers, 4, 0, 11, lambda *a: None)


MALFORMED = "Plan: malformed program (a value out of range, or a peer without a link)"
LINKS = (False, True)  # _plan's fds: rank 0 is this one (no link), rank 1 has one
BIG = (2**63 - 1) // 2  # a span's offset or length at most


def _well_formed(words: list[int], buffers: int = 4) -> bool:
    """Whether ``words`` is a program as engines/native_tcp.py writes it, read here apart from the C reader:
    steps (each its index and its copies, sends and receives), every value in range, every peer linked."""
    words = iter(words)

    def take(low: int, high: int) -> int:
        value = next(words, None)
        if value is None or not low <= value <= high:
            raise ValueError
        return value

    def span(optional: bool = False) -> int:  # the buffer; -1 for none where optional
        buffer = take(-1 if optional else 0, buffers - 1)
        take(0, BIG)
        return buffer

    try:
        for _ in range(take(0, 1 << 20)):
            take(0, 2**32 - 1)
            copies, sends, recvs = take(0, 1 << 16), take(0, 1 << 16), take(0, 1 << 16)
            for _ in range(copies):
                span(), span(), take(0, BIG), span(optional=True)
            for _ in range(sends):
                peer, _, _ = take(0, len(LINKS) - 1), span(), take(0, BIG)
                if not LINKS[peer]:
                    return False
            for _ in range(recvs):
                peer, _, _, into = take(0, len(LINKS) - 1), span(), take(0, BIG), span(optional=True)
                stage, _ = take(-1, buffers - 1), take(0, 1)
                if not LINKS[peer] or (into >= 0 and stage < 0):  # a reducing receive needs a stage
                    return False
    except ValueError:
        return False
    return next(words, None) is None


@pytest.mark.parametrize("words", [
    [],  # not even a step count
    [-1],  # a negative step count
    [1, 0, 0],  # a step cut short
    [0, 7],  # a word after the last step
    [1, 0, 1, 0, 0, 4, 0, 1, 0, 8, -1, 0],  # a copy from buffer 4 of 4
    [1, 0, 0, 1, 0, 0, 0, 0, 8],  # a send to this rank, which has no link
    [1, 0, 0, 1, 0, 2, 0, 0, 8],  # a send to rank 2 of 2
    [1, 0, 0, 0, 1, 1, 0, 0, 8, 1, 0, -1, 0],  # a receive reduced into buffer 1 with no stage
    [1, 0, 0, 0, 1, 1, 0, 0, 8, -1, 0, -1, 2],  # a receive's "later" flag of 2
])
def test_malformed_programs_are_refused_saying_so(words):
    assert not _well_formed(words)
    with pytest.raises(ValueError) as refused:
        _plan(words)
    assert str(refused.value) == MALFORMED


@pytest.mark.parametrize("words", [
    [0],
    [1, 0, 1, 0, 0, 0, 0, 1, 0, 8, -1, 0],  # copy 8 bytes of buffer 0 into buffer 1
    [1, 0, 0, 1, 0, 1, 0, 0, 8],  # send 8 bytes to rank 1
    [1, 0, 0, 0, 1, 1, 0, 0, 8, 1, 0, 3, 0],  # receive 8 bytes from rank 1, reduced into buffer 1 through 3
])
def test_well_formed_programs_are_planned(words):
    assert _well_formed(words)
    assert isinstance(_plan(words), tcp.Plan)


def _flat(steps) -> list[int]:
    words = [len(steps)]
    for index, copies, sends, recvs in steps:
        words += [index, len(copies), len(sends), len(recvs)]
        for op in copies + sends + recvs:
            words += [w for part in op for w in (part if isinstance(part, tuple) else (part,))]
    return words


_span = st.tuples(st.integers(0, 3), st.integers(0, 64))
_copy = st.tuples(_span, _span, st.integers(0, 64), st.tuples(st.integers(-1, 3), st.integers(0, 64)))
_send = st.tuples(st.just(1), _span, st.integers(0, 64))
_recv = st.tuples(st.just(1), _span, st.integers(0, 64), st.tuples(st.just(-1), st.integers(0, 64)),
                  st.integers(-1, 3), st.integers(0, 1))
_step = st.tuples(st.integers(0, 9), st.lists(_copy, max_size=2), st.lists(_send, max_size=2),
                  st.lists(_recv, max_size=2))
# programs as engines/native_tcp.py writes them, and the same with one word changed or one dropped
_programs = st.lists(_step, max_size=3).map(_flat)
_changed = st.tuples(_programs, st.integers(0, 200), st.integers(-3, 70) | st.none()).map(
    lambda p: p[0][:p[1] % len(p[0])] + ([] if p[2] is None else [p[2]]) + p[0][p[1] % len(p[0]) + 1:])


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.integers(-3, 40) | st.integers(-2**63, 2**63 - 1), max_size=40) | _programs | _changed)
def test_any_program_is_planned_or_refused_as_its_layout_says(words):
    try:
        plan = _plan(words)
    except ValueError as exc:
        assert str(exc) == MALFORMED
        assert not _well_formed(words), words
    else:
        assert isinstance(plan, tcp.Plan)
        assert _well_formed(words), words


def test_runs_refuse_buffers_smaller_than_their_spans_or_read_only():
    a, b = os.pipe()
    try:
        # one step: copy 8 bytes of data into out, send nothing
        plan = _plan([1, 0, 1, 0, 0, 0, 0, 1, 0, 8, -1, 0], fds=(-1, a))
        small, ok = np.zeros(1, np.float32), np.zeros(2, np.float32)
        with pytest.raises(TypeError, match="bind"):
            plan.run({"data": ok, "out": ok}, 0, 1.0, None, 1.0)
        plan.bind((ok, ok))
        with pytest.raises(ValueError, match="smaller"):
            plan.run({"data": ok, "out": small}, 0, 1.0, None, 1.0)
        with pytest.raises(ValueError, match="smaller"):
            plan.run({"data": ok}, 0, 1.0, None, 1.0)
        read_only = np.zeros(2, np.float32)
        read_only.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            plan.run({"data": ok, "out": read_only}, 0, 1.0, None, 1.0)
        assert plan.run({"data": np.arange(2, dtype=np.float32), "out": ok}, 0, 1.0, None, 1.0) is None
        assert ok.tolist() == [0.0, 1.0]
    finally:
        os.close(a)
        os.close(b)


# ---- which engine a group gets ---------------------------------------------------------------------

def test_plain_links_take_the_compiled_engine_unless_told_otherwise():
    ours, theirs = socket.socketpair()
    try:
        transport = TcpTransport(0, 2, {1: ours})
        assert transport.descriptors() == [-1, ours.fileno()]
        assert isinstance(schedule_engine(transport, Settings(engine="native"))[0], NativeTcpEngine)
        assert isinstance(schedule_engine(transport, Settings(engine="auto"))[0], NativeTcpEngine)
        assert isinstance(schedule_engine(transport, Settings(engine="python"))[0], ScheduleEngine)
        assert schedule_engine(transport, Settings(engine="auto"))[1].startswith("native (compiled")
        assert schedule_engine(transport, Settings(engine="python"))[1] == "python (ALLREDUCE_ENGINE=python)"
    finally:
        ours.close()
        theirs.close()


def test_tls_links_stay_on_the_python_engine():
    ours, theirs = socket.socketpair()
    wrapped = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).wrap_socket(ours, server_side=True, do_handshake_on_connect=False)
    try:
        transport = TcpTransport(0, 2, {1: wrapped})
        assert transport.descriptors() is None
        engine, why = schedule_engine(transport, Settings(engine="native"))
        assert isinstance(engine, ScheduleEngine) and why == "python (the links are not all plain TCP)"
    finally:
        wrapped.close()
        theirs.close()


# ---- both engines in one group --------------------------------------------------------------------

def _mixed(body):
    """A rank body that joins a TCP group on the compiled engine (even ranks) or the Python one (odd),
    runs ``body`` and returns what it returned and how many planned calls the compiled engine made for it."""
    port = free_port()

    def run(rank, size):
        from allreduce.engines.native_tcp import NativeScheduled

        def planned() -> int:
            return sum(isinstance(o, NativeScheduled) for o in gc.get_objects())
        inherited = planned()  # what the forking test process still held of earlier tests
        os.environ["ALLREDUCE_ENGINE"] = "native" if rank % 2 == 0 else "python"
        os.environ["ALLREDUCE_TRANSPORT"] = "tcp"
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=60)
        try:
            value = body(rank, size)
            return value, planned() - inherited
        finally:
            dist.destroy_process_group()
    return run


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_both_engines_in_one_group_every_collective(size):
    def body(rank, size):
        return all_reduce_matrix(rank, size) + rooted_matrix(rank, size) + block_matrix(rank, size)

    results = run_ranks(_mixed(body), size, init=False, deadline=400)
    assert [wrong for wrong, _ in results] == [[]] * size
    assert all((planned > 0) == (rank % 2 == 0) for rank, (_, planned) in enumerate(results))


def _large(count: int, dtype, rank: int) -> np.ndarray:
    """Rank ``rank``'s input of a large case: small integers (exact in every dtype), varying along the array."""
    values = (np.arange(count) * (rank + 3)) % 7 - 2
    return (values + 1j * (rank - 1)).astype(dtype) if np.dtype(dtype).kind == "c" else values.astype(dtype)


# Segments larger than the compiled engine's staging ring (native._tcp.STAGE_RING), in many laps and a
# part; a byte dtype's SUM wraps around; complex PRODUCT has no compiled kernel (numpy's, called back).
LARGE = [(1 << 16, np.float64, "SUM"), ((1 << 20) + 3, np.float64, "SUM"), (3 << 20, np.float64, "SUM"),
         ((1 << 21) + 5, np.int8, "SUM"), ((1 << 18) + 7, np.complex128, "PRODUCT")]


def test_large_segments_reduce_as_they_arrive_on_both_engines():
    def body(rank, size):
        wrong = []
        for count, dtype, op in LARGE:
            x = _large(count, dtype, rank)
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            inputs = [_large(count, dtype, r) for r in range(size)]
            want = np.sum(inputs, axis=0, dtype=dtype) if op == "SUM" else np.prod(inputs, axis=0, dtype=dtype)
            if not np.array_equal(x, want):
                wrong.append((count, np.dtype(dtype).name, op))
        return wrong

    results = run_ranks(_mixed(body), 3, init=False, deadline=240)
    assert [wrong for wrong, _ in results] == [[]] * 3


# ---- failures, word for word -----------------------------------------------------------------------

def _failure(scenario, size, engine, timeout=30.0):
    """Each rank's outcome of ``scenario(rank, size)`` on ``engine`` over TCP (errors as (type, message))."""
    env = {"ALLREDUCE_ENGINE": engine, "ALLREDUCE_TRANSPORT": "tcp"}
    return run_ranks(scenario, size, timeout=timeout, deadline=120, env=env, expect_errors=True)


def _mismatch(rank, size):
    dist.all_reduce(np.ones(100, np.float32))
    dist.all_reduce(np.ones(7 if rank == 1 else 6, np.float32))
    return "returned"


def _gives_up(rank, size):
    dist.all_reduce(np.ones(10, np.float32))
    if rank == 2:
        dist.all_reduce(np.ones(10, np.int32))  # rank 2 differs: rank 1 or 3 sees it first, then all hear of it
    else:
        dist.all_reduce(np.ones(10, np.float32))
    return "returned"


def _mismatch_then_exit(rank, size):
    """As _mismatch, but the rank that fails exits at once, leaving no thread of its own time to run."""
    try:
        return _mismatch(rank, size)
    except dist.Mismatch:
        if rank == 0:  # the rank that sees rank 1's count first
            os._exit(7)
        raise


def _late(rank, size):
    dist.all_reduce(np.ones(10, np.float32))
    if rank == 1:
        time.sleep(4.0)
        raise SystemExit(0)
    dist.all_reduce(np.ones(10, np.float32))
    return "returned"


@pytest.mark.parametrize("scenario,size", [(_mismatch, 2), (_mismatch, 3), (_gives_up, 4), (_late, 2)])
def test_failures_read_the_same_on_both_engines(scenario, size):
    timeout = 2.0 if scenario is _late else 30.0
    python = _failure(scenario, size, "python", timeout)
    native = _failure(scenario, size, "native", timeout)
    assert native == python
    assert all(r != "returned" for rank, r in enumerate(python) if not (scenario is _late and rank == 1))
    if scenario is not _late:  # every rank heard the ABORT of the first to fail, none a bare reset
        assert all("aborted" in r[2] or "different collective" in r[2] for r in python), python


@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_rank_that_exits_on_its_error_has_told_its_peers(engine):
    outcomes = _failure(_mismatch_then_exit, 3, engine)
    assert outcomes[0] == ("killed", 7)
    for _kind, name, message in outcomes[1:]:
        assert name == "Mismatch" and "rank 0 aborted: Mismatch" in message, outcomes


def test_an_abort_is_on_the_wire_when_it_returns(monkeypatch):
    """What the sockets take leaves in the caller's thread: the thread that sends the rest (here one that
    does nothing, as one the process exits before) is not needed for an ABORT to reach the peer."""
    from allreduce.transport.tcp import transport as tcp_transport

    monkeypatch.setattr(tcp_transport, "_drain", lambda links, deadline: None)
    ours, theirs = socket.socketpair()
    try:
        transport = TcpTransport(0, 2, {1: ours})
        transport.abort("Mismatch: rank 0 saw it first")
        transport.close()
        theirs.setblocking(False)
        assert theirs.recv(1 << 16) == wire.abort_frame("Mismatch: rank 0 saw it first")
    finally:
        ours.close()
        theirs.close()


def _dies(rank, size):
    dist.all_reduce(np.ones(10, np.float32))
    if rank == 1:
        time.sleep(0.2)
        os._exit(3)
    start = time.monotonic()
    try:
        dist.all_reduce(np.ones(1 << 18, np.float32))
    except dist.AllreduceError as exc:
        return type(exc).__name__, "rank 1" in str(exc), time.monotonic() - start
    return "returned"


def test_a_dead_rank_is_named_within_seconds():
    outcomes = _failure(_dies, 3, "native")
    assert outcomes[1] == ("killed", 3)
    for rank in (0, 2):
        kind, named, seconds = outcomes[rank]
        assert kind in ("PeerLost", "GroupBroken") and named and seconds < 10, outcomes[rank]


def _interrupted(rank, size):
    dist.all_reduce(np.ones(10, np.float32))
    if rank == 1:
        time.sleep(2.0)
        try:
            dist.all_reduce(np.ones(10, np.float32))
        except dist.AllreduceError as exc:
            return type(exc).__name__, str(exc)
        return "returned"

    def ring(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        dist.all_reduce(np.ones(10, np.float32))
    except KeyboardInterrupt:
        pass
    else:
        return "returned"
    try:
        dist.all_reduce(np.ones(10, np.float32))
    except dist.AllreduceError as exc:
        return type(exc).__name__, str(exc)
    return "returned after the interrupt"


def test_a_signal_interrupts_a_wait_and_breaks_the_group_on_both_engines():
    python = _failure(_interrupted, 2, "python")
    native = _failure(_interrupted, 2, "native")
    assert native == python
    assert native[0][0] == "GroupBroken" and "KeyboardInterrupt" in native[0][1], native
    # rank 0's frame left before the signal, so rank 1's call completes: the interrupted rank owed it nothing


def _cut_mid_frame(rank, size):
    """Rank 0 is interrupted while a large frame to rank 1 is half sent (rank 1 is not reading yet)."""
    dist.all_reduce(np.ones(10, np.float32))
    x = np.ones(8 << 20, np.float32)
    if rank == 1:
        time.sleep(0.5)
    else:
        signal.signal(signal.SIGALRM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt))
        signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        dist.all_reduce(x)
    except KeyboardInterrupt:
        return "interrupted"
    except dist.AllreduceError as exc:
        return type(exc).__name__, "rank 0" in str(exc)
    return "returned"


@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_frame_half_sent_when_a_rank_gives_up_is_finished_before_its_abort(engine):
    outcomes = _failure(_cut_mid_frame, 2, engine)
    assert outcomes[0] == "interrupted"
    assert outcomes[1] == ("PeerLost", True), outcomes  # its ABORT or its closed link; never a torn frame
