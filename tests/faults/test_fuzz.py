"""Hostile input: the wire parsers fuzzed directly, and a running job's ports fed junk.

Pure parsers (hypothesis): the peer frame header (:mod:`allreduce.wire`) and the handshake
(:mod:`allreduce.auth`) take any bytes and either parse them or raise ``ProtocolError``; a header
that differs in any field from the expected one is refused before its payload is read.

Live: while a three-rank job runs collectives and forms subgroups, junk connections hit its store
port (random bytes, requests without the handshake, wrong secrets, replayed and truncated
responses, authenticated clients that then send garbage); while a group forms, the same hit a
rank's listening port. The job must go on, nothing sent without the secret may reach the store, and
the store host's memory must stay flat. Every frame tried is counted; the last test checks that every
kind on the live tests' menus was tried, and prints the counts.
"""

from __future__ import annotations

import collections
import hashlib
import multiprocessing as mp
import os
import random
import socket
import struct
import threading
import time

import numpy as np
import pytest
from support.harness import free_port, run_ranks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allreduce as dist
from allreduce import auth, collectives, wire

from allreduce.errors import Mismatch, PeerLost, ProtocolError
from allreduce.rendezvous import HashStore
from allreduce.rendezvous import storewire
from allreduce.security import Security
from allreduce.transport import RecvSpec, mesh, tcp

FRAMES: collections.Counter = collections.Counter()  # what was tried, by kind, for the report
SECRET = "fuzz-secret"

headers = st.builds(
    wire.Header, st.just(wire.DATA), st.sampled_from(sorted(collectives.BY_CODE)), st.integers(0, 15),
    st.integers(0, 7), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2**32 - 1),
    st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), algorithm=st.integers(0, 2**32 - 1))


# ---- pure parsers --------------------------------------------------------------------------------

@settings(max_examples=1500, deadline=None)
@given(st.binary(min_size=0, max_size=80))
def test_any_bytes_parse_or_raise_protocol_error(data):
    FRAMES["wire: random header bytes"] += 1
    try:
        header = wire.decode(data)
    except ProtocolError:
        return
    assert len(data) == wire.HEADER_SIZE and wire.encode(header) == data


@settings(max_examples=1500, deadline=None)
@given(headers, st.data())
def test_mutated_header_is_refused_before_its_payload(expected, data):
    FRAMES["wire: mutated valid headers"] += 1
    frame = bytearray(wire.encode(expected))
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(0, wire.HEADER_SIZE - 1))] = data.draw(st.integers(0, 255))
    try:
        got = wire.decode(bytes(frame))
    except ProtocolError:
        return
    if got == expected:
        return
    if got.kind == wire.ABORT:
        assert got.nbytes <= wire.MAX_ABORT_REASON  # what a receiver would read as the reason
        return
    with pytest.raises(Mismatch, match="expected"):  # e.g. an nbytes of 2**60: an error, not an allocation
        wire.check(expected, got)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=6000))
def test_abort_frames_are_bounded(reason):
    FRAMES["wire: abort frames"] += 1
    frame = wire.abort_frame(reason)
    header = wire.decode(frame[:wire.HEADER_SIZE])
    assert header.kind == wire.ABORT and header.nbytes == len(frame) - wire.HEADER_SIZE <= wire.MAX_ABORT_REASON


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=60), st.sampled_from([b"", auth.MAGIC, auth.MAGIC + bytes([auth.VERSION])]))
def test_challenge_parser_takes_any_bytes(noise, prefix):
    FRAMES["auth: challenges"] += 1
    try:
        nonce = auth.read_challenge(prefix + noise)
    except ProtocolError:
        return
    assert len(nonce) == auth.NONCE_SIZE


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=100), max_size=6))
def test_responder_refuses_junk_and_stays_small(pieces):
    FRAMES["auth: responses"] += 1
    responder = auth.Responder(b"key", b"store")
    for piece in pieces:
        reply, rest = responder.feed(piece)
        assert len(responder._got) <= auth.RESPONSE_SIZE
        if reply is not None:
            assert reply == auth.REFUSAL and rest == b"" and responder.passed is False
            return


# ---- a hostile peer that passed the handshake ----------------------------------------------------

def linked_pair():
    """Rank 0's transport and a raw socket that authenticated as rank 1 of the same group."""
    store = HashStore(timeout=10)
    out = {}
    thread = threading.Thread(
        target=lambda: out.setdefault(0, tcp.TcpTransport.connect(0, 2, store, "127.0.0.1", "g", 10, Security())))
    thread.start()
    raw = mesh.dial(tcp.TcpPeering(1, 2, "127.0.0.1", "g", Security()), store, 0, time.monotonic() + 10)
    thread.join(10)
    return out[0], raw


EXPECTED = wire.Header(wire.DATA, 0, 10, 0, 0, 0, 1, 1024, 4096)  # all_reduce #1, 1024 float32


@pytest.mark.parametrize("name,frame,error", [
    ("oversized length", wire.encode(EXPECTED._replace(nbytes=2**62)) + bytes(64), Mismatch),
    ("other collective", wire.encode(EXPECTED._replace(collective=2)) + bytes(4096), Mismatch),
    ("later sequence", wire.encode(EXPECTED._replace(seq=9)) + bytes(4096), Mismatch),
    ("foreign bytes", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(40), ProtocolError),
    ("oversized abort", wire.encode(wire.Header(wire.ABORT, 0, 0, 0, 0, 0, 0, 0, 2**40)), ProtocolError),
    ("truncated header", wire.encode(EXPECTED)[:17], PeerLost),
])
def test_bad_frame_from_an_authenticated_peer_is_an_error_not_an_allocation(name, frame, error):
    FRAMES["link: bad frames from an authenticated peer"] += 1
    transport, raw = linked_pair()
    dest = np.full(1024, 7.0, np.float32)
    raw.sendall(frame)
    if error is PeerLost:
        raw.close()
    start = time.monotonic()
    with pytest.raises(error):
        transport.exchange([], [RecvSpec(1, EXPECTED, memoryview(dest.view(np.uint8)))], time.monotonic() + 5)
    assert time.monotonic() - start < 2
    transport.close()
    raw.close()


# ---- junk at the ports of a running job -----------------------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _connect(port: int, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection((host, port), timeout=5)
    sock.settimeout(5)
    return sock


def _gone(port: int) -> bool:
    """Whether the store has shut down (its listener closes with it)."""
    try:
        _connect(port).close()
        return False
    except ConnectionRefusedError:
        return True


def _drain(sock: socket.socket) -> bytes:
    """What the server says before it hangs up (it must hang up; a reset is a hang-up too)."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _challenge(sock: socket.socket) -> bytes:
    return auth.read_challenge(auth.recv_exactly(sock, auth.CHALLENGE_SIZE, time.monotonic() + 30, "the challenge"))


JUNK = ("random bytes", "request without handshake", "huge length without handshake", "wrong secret",
        "random response", "mutated response", "replayed response", "truncated response",
        "authenticated, then garbage", "authenticated, then huge length")


def store_junk(port: int, rng: random.Random, recorded: list) -> str:
    """Send one kind of junk on a new connection to the store, check that it is refused; its kind."""
    kind = rng.choice(JUNK)
    with _connect(port) as sock:
        if kind == "replayed response" and not recorded:  # first, a genuine client records a response
            _record(sock, recorded)
            return "genuine client (recorded for replay)"
        try:
            _send_junk(sock, kind, rng, recorded)
            sock.shutdown(socket.SHUT_WR)  # short junk: the server would wait for the rest until its deadline
        except (BrokenPipeError, ConnectionResetError, OSError):  # hung up on us while we were still sending
            pass
        _drain(sock)  # the server hangs up on every kind of junk
    return kind


def _record(sock: socket.socket, recorded: list) -> None:
    key = SECRET.encode()
    server_nonce = _challenge(sock)
    client_nonce, response = auth.respond(key, b"store", server_nonce)
    sock.sendall(response)
    auth.check_proof(key, b"store", server_nonce, client_nonce, sock.recv(auth.PROOF_SIZE, socket.MSG_WAITALL))
    recorded.append(response)


def _send_junk(sock: socket.socket, kind: str, rng: random.Random, recorded: list) -> None:
    key = SECRET.encode()
    if kind == "random bytes":
        sock.sendall(os.urandom(rng.randint(1, 300)))
        return
    if kind == "request without handshake":
        sock.sendall(storewire.encode(storewire.Set("pwned", b"x")))
        return
    if kind == "huge length without handshake":
        sock.sendall(struct.pack("!4sBBI", storewire.MAGIC, storewire.VERSION, 1, 2**32 - 1))
        return
    server_nonce = _challenge(sock)
    response = auth.respond(key, b"store", server_nonce)[1]
    if kind == "truncated response":
        sock.sendall(response[:rng.randrange(auth.RESPONSE_SIZE)])
        return
    if kind.startswith("authenticated"):
        sock.sendall(response)
        assert len(sock.recv(auth.PROOF_SIZE, socket.MSG_WAITALL)) == auth.PROOF_SIZE
        if kind == "authenticated, then garbage":
            sock.sendall(b"\0" + os.urandom(rng.randint(1, 300)))
        else:
            sock.sendall(struct.pack("!4sBBI", storewire.MAGIC, storewire.VERSION, 1, 60 << 20))
        return
    if kind == "wrong secret":
        response = auth.respond(b"guess", b"store", server_nonce)[1]
    elif kind == "random response":
        response = os.urandom(auth.RESPONSE_SIZE)
    elif kind == "mutated response":
        flipped = rng.randrange(8 * len(response))
        response = bytearray(response)
        response[flipped // 8] ^= 1 << flipped % 8
    else:
        response = recorded[0]
    sock.sendall(bytes(response))
    assert sock.recv(auth.PROOF_SIZE, socket.MSG_WAITALL) == auth.REFUSAL, kind


def _busy_job(port: int, calls: int):
    def body(rank, size):
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=20)
        store = dist.default_group().store
        wrong, rss0 = 0, None
        for call in range(1, calls + 1):
            x = np.full(1000, rank + 1.0, np.float32)
            dist.all_reduce(x)
            wrong += int(x[0] != size * (size + 1) / 2)
            if call % 25 == 0:  # store traffic, and new listening ports
                group = dist.new_group(list(range(size)))
                dist.all_reduce(x, group=group)
                dist.destroy_process_group(group)
            if call == calls // 4:
                rss0 = rss_bytes()
            time.sleep(0.003)
        dist.barrier()
        pwned = store.check(["pwned"])
        growth = rss_bytes() - rss0
        dist.barrier()
        dist.destroy_process_group()
        return calls, wrong, pwned, growth
    return body


def _fuzz_store(port: int, stop, out) -> None:
    """Junk at the store until ``stop`` is set; put (counts by kind, failures) on ``out``."""
    rng, recorded, silent = random.Random(7), [], []
    tried: collections.Counter = collections.Counter()
    failures = []
    while not stop.is_set():
        try:
            if rng.random() < 0.02 and len(silent) < 8:  # connect and say nothing, for a while
                silent.append(_connect(port))
                tried["silent connection"] += 1
                continue
            tried[store_junk(port, rng, recorded)] += 1
        except ConnectionRefusedError:
            time.sleep(0.01)  # the job is not up yet, or already gone
        except Exception as exc:  # a wrong answer from the server, unless the job has just ended
            if not stop.is_set() and not _gone(port):
                failures.append(repr(exc))
    for sock in silent:
        sock.close()
    out.put((dict(tried), failures))


@pytest.fixture(scope="module")
def store_fuzzed():
    """Junk at the store port while a job of 3 ranks runs: (tries by kind, the fuzzer's failures, the ranks'
    results); once per module, for the test of the job and the test of the menus."""
    # The fuzzer is a process forked before the ranks: a thread of ours alive while they fork could
    # leave them a lock it held (the import lock, say) that nobody would ever release.
    port = free_port()
    ctx = mp.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    fuzzer = ctx.Process(target=_fuzz_store, args=(port, stop, out), daemon=True)
    fuzzer.start()
    try:
        results = run_ranks(_busy_job(port, 600), 3, init=False, deadline=60,
                            env={"ALLREDUCE_SECRET": SECRET, "ALLREDUCE_TRANSPORT": "tcp"})
    finally:
        stop.set()
        tried, failures = out.get(timeout=30)
        fuzzer.join(10)
    FRAMES.update({f"store port: {k}": v for k, v in tried.items()})
    return tried, failures, results


def test_store_port_junk_while_a_job_runs(store_fuzzed):
    tried, failures, results = store_fuzzed
    assert not failures, failures[:5]
    assert sum(tried.values()) > 100, tried
    for _calls, wrong, pwned, _growth in results:
        assert wrong == 0 and not pwned
    assert results[0][3] < 8 << 20, f"store host grew by {results[0][3] >> 20} MiB"


PEER_JUNK = ("random bytes", "truncated hello", "hello for another group", "hello to another rank",
             "hello from an impossible rank", "hello, wrong secret", "hello, random response")


@pytest.fixture(scope="module")
def peer_fuzzed():
    """Junk at rank 0's peer port while a group of 4 forms: (tries by kind, the ranks whose transport formed)."""
    store = HashStore(timeout=20)
    size, rng = 4, random.Random(3)
    transports = {}

    def rank(r):
        transports[r] = tcp.TcpTransport.connect(r, size, store, "127.0.0.1", "fuzzed", 20, Security())

    zero = threading.Thread(target=rank, args=(0,))
    zero.start()
    host, port = store.get("tcp/0").decode().rsplit(":", 1)
    digest = hashlib.blake2b(b"fuzzed", digest_size=16).digest()
    kinds = collections.Counter()
    others = [threading.Thread(target=rank, args=(r,)) for r in range(1, size)]
    for i in range(300):
        if i == 100:  # the real ranks join among the junk
            for t in others:
                t.start()
        kind = rng.choice(PEER_JUNK)
        hello = {"hello for another group": struct.pack("<4sii16s", b"ARHI", 1, 0, bytes(16)),
                 "hello to another rank": struct.pack("<4sii16s", b"ARHI", 2, 5, digest),
                 "hello from an impossible rank": struct.pack("<4sii16s", b"ARHI", 99, 0, digest)}.get(
                     kind, struct.pack("<4sii16s", b"ARHI", rng.randrange(1, size), 0, digest))
        try:
            sock = _connect(int(port), host)
        except (ConnectionRefusedError, ConnectionResetError):  # the group formed and rank 0 closed its listener
            break
        with sock:
            if kind == "random bytes":
                sock.sendall(os.urandom(rng.randint(1, 100)))
            elif kind == "truncated hello":
                sock.sendall(hello[:rng.randrange(len(hello))])
            else:
                sock.sendall(hello)
                if kind.startswith("hello,"):
                    try:
                        server_nonce = _challenge(sock)
                    except ConnectionError:  # dropped at the hello: a real rank took that place already
                        kinds[kind] += 1
                        continue
                    if kind == "hello, wrong secret":
                        response = auth.respond(b"guess", b"peer" + hello, server_nonce)[1]
                    else:
                        response = os.urandom(auth.RESPONSE_SIZE)
                    sock.sendall(response)
                    assert sock.recv(auth.PROOF_SIZE, socket.MSG_WAITALL) == auth.REFUSAL
            try:
                sock.shutdown(socket.SHUT_WR)
                _drain(sock)
            except OSError:  # hung up on already
                pass
        kinds[kind] += 1
    for t in [zero, *others]:
        t.join(20)
    FRAMES.update({f"peer port: {k}": v for k, v in kinds.items()})
    for transport in transports.values():
        transport.close()
    return kinds, sorted(transports)


def test_peer_port_junk_while_the_group_forms(peer_fuzzed):
    _, formed = peer_fuzzed
    assert formed == [0, 1, 2, 3]


MENUS = {"store port": (*JUNK, "silent connection", "genuine client (recorded for replay)"),
         "peer port": PEER_JUNK}  # what the live tests mean to try, by the port they feed


def test_every_kind_of_junk_was_tried_and_the_counts_are_reported(capsys, store_fuzzed, peer_fuzzed):
    """Each live fuzzer tried every kind on its menu (a kind never sent tests nothing); the counts of
    everything fuzzed in this session are printed (the live fuzzers run here if no test ran them yet)."""
    tried = {"store port": store_fuzzed[0], "peer port": peer_fuzzed[0]}
    with capsys.disabled():
        print(f"\nfuzzed frames: {sum(FRAMES.values())} in all")
        for kind, count in sorted(FRAMES.items()):
            print(f"  {count:6d}  {kind}")
    untried = [f"{port}: {kind}" for port, menu in MENUS.items() for kind in menu if not tried[port].get(kind)]
    assert untried == [], f"never tried: {untried}"
