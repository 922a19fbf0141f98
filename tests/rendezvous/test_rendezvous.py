"""Rendezvous: the store protocol (pure), the three stores, launcher environments, init_method.

Ranks are threads here, except one check that runs two processes on a file store; every TCP
server binds 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allreduce.rendezvous as rdv
from allreduce import auth
from allreduce.errors import CommTimeout, PeerLost, ProtocolError, RendezvousError
from allreduce.rendezvous import FileStore, HashStore, TCPStore, from_environment, rendezvous
from allreduce.rendezvous import storewire
from allreduce.rendezvous.storeserver import HANDSHAKE_CONTEXT
from allreduce.settings import DEFAULT_TIMEOUT
from support.harness import free_port
from support.paths import SRC

LAUNCHER_VARS = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_LAUNCH_NODE_IPADDR",
]


def run_threads(n: int, fn) -> list:
    """Run ``fn(rank)`` in n threads; return each result, or the exception it raised."""
    results: list = [None] * n

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except Exception as exc:  # collected for the test to inspect
            results[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(params=["hash", "tcp", "file"])
def store(request, tmp_path):
    if request.param == "hash":
        made = HashStore(timeout=5)
    elif request.param == "tcp":
        made = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    else:
        made = FileStore(tmp_path / "store", timeout=5)
    yield made
    made.close()


# --- storewire: pure encode/decode ------------------------------------------------------------

keys = st.text(min_size=1, max_size=12)
millis = st.integers(0, storewire.MAX_TIMEOUT_MS)
key_lists = st.lists(keys, max_size=4).map(tuple)
requests = st.one_of(
    st.builds(storewire.Set, keys, st.binary(max_size=40)),
    st.builds(storewire.Get, keys, millis),
    st.builds(storewire.Add, keys, st.integers(storewire.I64_MIN, storewire.I64_MAX)),
    st.builds(storewire.Wait, key_lists, millis),
    st.builds(storewire.Check, key_lists),
    st.builds(storewire.Delete, keys),
)
responses = st.one_of(
    st.just(storewire.Ok()),
    st.builds(storewire.Value, st.binary(max_size=40)),
    st.builds(storewire.Count, st.integers(storewire.I64_MIN, storewire.I64_MAX)),
    st.builds(storewire.Flag, st.booleans()),
    st.builds(storewire.TimedOut, key_lists),
    st.builds(storewire.Failed, st.text(max_size=20)),
)


def feed_in_pieces(decoder, stream: bytes, cuts: list[int]) -> list:
    out, start = [], 0
    for cut in sorted(cuts) + [len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    return out


@pytest.mark.parametrize("kind, decoder",
                         [(requests, storewire.RequestDecoder), (responses, storewire.ResponseDecoder)],
                         ids=["requests", "responses"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_messages_round_trip_through_any_split(kind, decoder, data):
    messages = data.draw(st.lists(kind, max_size=6))
    stream = b"".join(storewire.encode(m) for m in messages)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    assert feed_in_pieces(decoder(), stream, cuts) == messages


header_prefixes = st.sampled_from([b"", storewire.MAGIC, storewire.MAGIC + bytes([storewire.VERSION])])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header_prefixes, st.binary(max_size=64), st.data())
def test_garbage_raises_only_protocol_error(prefix, noise, data):
    stream = prefix + noise
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=4))
    for decoder in (storewire.RequestDecoder(), storewire.ResponseDecoder()):
        try:
            feed_in_pieces(decoder, stream, cuts)
        except ProtocolError:
            with pytest.raises(ProtocolError):  # a failed decoder stays failed
                decoder.feed(storewire.encode(storewire.Delete("k")))


@settings(max_examples=200, deadline=None)
@given(requests, st.data())
def test_corrupted_frames_raise_only_protocol_error(message, data):
    frame = bytearray(storewire.encode(message))
    at = data.draw(st.integers(0, len(frame) - 1))
    frame[at] = data.draw(st.integers(0, 255))
    try:
        storewire.RequestDecoder().feed(bytes(frame))
    except ProtocolError:
        pass


def header(code: int, size: int, magic: bytes = storewire.MAGIC, version: int = storewire.VERSION) -> bytes:
    return struct.pack("!4sBBI", magic, version, code, size)


@pytest.mark.parametrize("frame, words", [
    (b"GET / HTTP/1.1\r\n", "not"),
    (header(storewire.Get.code, 6, version=9), "version"),
    (header(77, 0), "unknown code"),
    (header(storewire.Set.code, storewire.MAX_BODY + 1), "limit"),
    (header(storewire.Delete.code, 3) + b"\x00\x00x", "key of 0 bytes"),
    (header(storewire.Delete.code, 4) + b"\x00\x02\xff\xfe", "UTF-8"),
    (header(storewire.Delete.code, 4) + b"\x00\x01ab", "past its fields"),
    (header(storewire.Get.code, 3) + b"\x00\x01a", "truncated"),
])
def test_decoder_names_the_fault(frame, words):
    with pytest.raises(ProtocolError, match=words):
        storewire.RequestDecoder().feed(frame)


def test_oversized_frame_is_refused_at_its_header():
    decoder = storewire.RequestDecoder()
    with pytest.raises(ProtocolError, match="limit"):
        decoder.feed(header(storewire.Set.code, 2**32 - 1))


def test_flag_must_be_zero_or_one():
    with pytest.raises(ProtocolError, match="Flag"):
        storewire.ResponseDecoder().feed(header(storewire.Flag.code, 1) + b"\x02")


def test_encode_refuses_what_the_decoder_would():
    with pytest.raises(ValueError, match="key"):
        storewire.encode(storewire.Delete("k" * (storewire.MAX_KEY + 1)))
    with pytest.raises(ValueError, match="key"):
        storewire.encode(storewire.Delete(""))
    with pytest.raises(ValueError, match="limit"):
        storewire.encode(storewire.Set("k", bytes(storewire.MAX_BODY)))


# --- store semantics, on every store ------------------------------------------------------------


def test_set_get_overwrite(store):
    store.set("a", b"one")
    store.set("a", bytearray(b"two"))
    assert store.get("a") == b"two"
    store.set("empty", b"")
    assert store.get("empty") == b""


def test_get_times_out_quickly_naming_the_key(store):
    start = time.monotonic()
    with pytest.raises(CommTimeout, match="'nowhere'"):
        store.get("nowhere", timeout=0.05)
    assert time.monotonic() - start < 1.0


def test_a_bounded_view_ends_every_request_by_its_deadline(store):
    """``within``: waits are cut to what is left, and a request made after the deadline fails at once."""
    bounded = store.within(0.3)
    bounded.set("here", b"1")
    start = time.monotonic()
    with pytest.raises(CommTimeout, match="'nowhere'"):
        bounded.get("nowhere", timeout=5)
    assert 0.2 < time.monotonic() - start < 1.0
    late = store.within(0.01)
    time.sleep(0.05)
    with pytest.raises(CommTimeout, match="no time left"):
        late.get("here")
    assert store.prefix("g").within(5).prefix("h").add("n", 2) == 2 and store.get("g/h/n") == b"2"


def test_add_counts_from_zero(store):
    assert store.add("n", 1) == 1
    assert store.add("n", 5) == 6
    assert store.add("n", -2) == 4
    assert store.add("n", 0) == 4
    assert store.get("n") == b"4"
    store.set("text", b"abc")
    with pytest.raises(ValueError, match="not a counter"):
        store.add("text", 1)
    store.set("big", str(storewire.I64_MAX).encode())
    with pytest.raises(ValueError, match="overflow"):
        store.add("big", 1)


def test_wait_check_delete(store):
    assert store.check([])
    assert not store.check(["a", "b"])
    store.set("a", b"")
    store.set("b", b"")
    assert store.check(["a", "b"])
    store.wait(["a", "b"], timeout=0.01)
    assert store.delete_key("a")
    assert not store.delete_key("a")
    with pytest.raises(CommTimeout, match="still missing: 'a'"):
        store.wait(["a", "b"], timeout=0.02)


def test_prefix_views_do_not_collide(store):
    one, two = store.prefix("g1"), store.prefix("g2")
    one.set("k", b"1")
    two.set("k", b"2")
    assert (one.get("k"), two.get("k"), store.get("g1/k")) == (b"1", b"2", b"1")
    assert one.prefix("sub").add("n", 3) == 3
    assert store.get("g1/sub/n") == b"3"
    assert one.check(["k"]) and not one.check(["n"])
    one.close()
    assert store.get("g2/k") == b"2"
    with pytest.raises(RendezvousError, match="closed"):
        one.get("k")


def test_blocking_get_and_wait_released_by_another_thread(store):
    def later():
        time.sleep(0.05)
        store.set("late", b"here")
        store.set("also", b"")

    setter = threading.Thread(target=later)
    setter.start()
    waited = run_threads(1, lambda _: store.wait(["late", "also"], timeout=5))
    assert store.get("late", timeout=5) == b"here"
    setter.join()
    assert waited == [None]


def test_bad_arguments(store):
    with pytest.raises(ValueError, match="key"):
        store.set("", b"x")
    with pytest.raises(TypeError):
        store.set(b"bytes-key", b"x")
    with pytest.raises(TypeError, match="list"):
        store.wait("ab")
    with pytest.raises(ValueError, match="timeout"):
        store.get("a", timeout=-1)
    with pytest.raises(ValueError, match="64-bit"):
        store.add("n", 2**63)


def test_closed_store_refuses(store):
    store.close()
    with pytest.raises(RendezvousError, match="closed"):
        store.set("a", b"")


def test_large_values(store):
    value = os.urandom(3 << 20)
    store.set("big", value)
    assert store.get("big") == value
    with pytest.raises(ValueError, match="limit"):
        store.set("huge", bytes(storewire.MAX_VALUE + 1))


# --- the TCP store ---------------------------------------------------------------------------


@pytest.fixture
def server():
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    yield store
    store.close()


def test_many_clients_in_threads(server):
    def rank(r: int) -> bytes:
        with TCPStore("127.0.0.1", server.port, timeout=5) as client:
            for _ in range(25):
                client.add("count", 1)
            client.set(f"rank/{r}", str(r).encode())
            client.wait([f"rank/{q}" for q in range(16)])
            return client.get("rank/0")

    assert run_threads(16, rank) == [b"0"] * 16
    assert server.add("count", 0) == 16 * 25


def test_one_client_shared_by_threads_does_not_serialize_blocking_gets(server):
    results = run_threads(8, lambda r: (server.set(f"k{r}", b"x"), server.get(f"k{(r + 1) % 8}"))[1])
    assert results == [b"x"] * 8


def raw(port: int) -> socket.socket:
    """A connection to the store past its handshake, for speaking the store's wire directly."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    auth.client_handshake(sock, auth.PUBLIC_KEY, HANDSHAKE_CONTEXT, time.monotonic() + 5)
    sock.settimeout(5)
    return sock


@pytest.mark.parametrize("frames", [
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"],
    [header(storewire.Set.code, storewire.MAX_BODY + 1)],
    [header(storewire.Get.code, 7, version=2) + b"\x00\x01a" + bytes(4)],
    [header(storewire.Delete.code, 4) + b"\x00\x09ab"],
    [storewire.encode(storewire.Get("never", 60_000))] * 80,  # too many requests ahead of their answers
])
def test_server_drops_only_the_offending_connection(server, frames):
    parked = threading.Thread(target=lambda: server.get("released", timeout=5))
    parked.start()
    with raw(server.port) as sock:
        sock.sendall(b"".join(frames))
        assert sock.recv(100) == b""  # the server hung up
    server.set("released", b"")
    parked.join(5)
    assert not parked.is_alive()
    assert server.add("still-up", 1) == 1


def test_server_survives_truncated_frames_and_abrupt_close(server):
    with raw(server.port) as sock:
        sock.sendall(header(storewire.Set.code, 100) + b"\x00\x01k")
    with raw(server.port) as sock:
        sock.sendall(storewire.encode(storewire.Get("parked", 60_000)))
    with raw(server.port) as sock:
        sock.sendall(storewire.encode(storewire.Set("k", b"v")) + storewire.encode(storewire.Get("k", 0)))
        decoder = storewire.ResponseDecoder()
        answers: list = []
        while len(answers) < 2:
            answers += decoder.feed(sock.recv(100))
        assert answers == [storewire.Ok(), storewire.Value(b"v")]
    assert server.get("k") == b"v"


def test_client_sees_peer_lost_when_the_server_closes(server):
    client = TCPStore("127.0.0.1", server.port, timeout=5)
    server.close()
    with pytest.raises(PeerLost, match=f"127.0.0.1:{server.port} closed the connection"):
        client.get("anything")
    client.close()


def test_a_client_never_reaches_a_later_server_on_its_port(server):
    """After its server closed, a client's next request must not land in a new store on the same port
    (its host formed another group there): a late goodbye or heartbeat would be read as the new
    group's. Its own connections all closed, the client dials again and finds another server."""
    client = TCPStore("127.0.0.1", server.port, timeout=5)
    client.set("before", b"1")
    server.close()
    later = TCPStore("127.0.0.1", server.port, is_server=True, timeout=5)
    try:
        with pytest.raises(PeerLost):  # the pooled connection is cut
            client.set("late", b"1")
        with pytest.raises(PeerLost, match="a new store serves that port"):  # and a new one refused
            client.set("late", b"1")
        assert not later.check(["late"]) and not later.check(["before"])
        later.set("fresh", b"2")  # the new store's own clients are unaffected
        with TCPStore("127.0.0.1", server.port, timeout=5) as newcomer:
            assert newcomer.get("fresh") == b"2"
    finally:
        client.close()
        later.close()


def test_close_stops_thread_and_listener():
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    port = store.port
    store.close()
    store.close()
    assert not [t for t in threading.enumerate() if t.name == f"allreduce-store:{port}"]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.mark.skipif(sys.platform != "linux", reason="needs all of 127/8 on the loopback")
def test_server_binds_exactly_its_host(server):
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", server.port), timeout=1).close()


def test_unreachable_store_says_where_and_what_to_check():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=f"127.0.0.1:{port}.*MASTER_ADDR"):
        TCPStore("127.0.0.1", port, timeout=0.3)
    assert time.monotonic() - start < 2


def test_client_may_start_before_the_server():
    port = free_port()
    later = threading.Timer(0.2, lambda: hosts.append(TCPStore("127.0.0.1", port, is_server=True, timeout=5)))
    hosts: list = []
    later.start()
    with TCPStore("127.0.0.1", port, timeout=5) as client:
        client.set("k", b"v")
    later.join()
    assert hosts[0].get("k") == b"v"
    hosts[0].close()


def test_port_in_use_is_a_rendezvous_error():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RendezvousError, match="cannot host"):
            TCPStore("127.0.0.1", port, is_server=True, timeout=1)


# --- the file store --------------------------------------------------------------------------


def test_file_store_is_shared_between_openers(tmp_path):
    path = tmp_path / "store"
    one, two = FileStore(path, timeout=5), FileStore(path, timeout=5)
    threading.Timer(0.05, lambda: one.set("k", b"v")).start()
    assert two.get("k") == b"v"
    assert [one.add("n", 1), two.add("n", 1), one.add("n", 1)] == [1, 2, 3]
    assert two.delete_key("k") and not one.check(["k"])
    one.close()
    two.cleanup()
    assert not path.exists()


def test_file_store_counts_atomically_across_processes(tmp_path):
    path = str(tmp_path / "store")
    code = "import sys; from allreduce.rendezvous import FileStore; s = FileStore(sys.argv[1], 10)\n" \
           "for _ in range(100): s.add('n', 1)"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [subprocess.Popen([sys.executable, "-c", code, path], env=env) for _ in range(2)]
    with FileStore(path, timeout=10) as store:
        for _ in range(100):
            store.add("n", 1)
        assert [p.wait(20) for p in procs] == [0, 0]
        assert store.add("n", 0) == 300


def test_file_store_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a store\n")
    with pytest.raises(RendezvousError, match="not a store file"):
        FileStore(path, timeout=1).get("k", timeout=0)


def test_file_store_path_must_be_openable(tmp_path):
    with pytest.raises(RendezvousError, match="cannot open"):
        FileStore(tmp_path / "missing-dir" / "store")


# --- launcher environments -------------------------------------------------------------------


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}, (1, 4, 1, 2, "10.0.0.1", 1234, "env")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (3, 8, 1, 2, "127.0.0.1", 29500, "openmpi")),
    ({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0"}, (2, 3, 0, None, "127.0.0.1", 29500, "pmi")),
    ({"PMI_RANK": "2", "PMI_SIZE": "3"}, (2, 3, None, None, "127.0.0.1", 29500, "pmi")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1"},
     (5, 6, 1, None, "10.1.1.1", 29500, "slurm")),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "MASTER_ADDR": "node7",
      "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1"},
     (0, 2, None, None, "node7", 29500, "slurm")),
    ({"WORLD_SIZE": "4"}, (None, 4, None, None, "127.0.0.1", 29500, "env")),
    ({}, (None, None, None, None, "127.0.0.1", 29500, "none")),
])
def test_launcher_flavors(env, expected):
    info = from_environment(env)
    got = (info.rank, info.world_size, info.local_rank, info.local_world_size, info.master_addr,
           info.master_port, info.source)
    assert got == expected


def test_first_family_wins():
    info = from_environment({"RANK": "0", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
                             "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert (info.rank, info.source) == (0, "env")
    assert from_environment({"PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_PROCID": "0"}).source == "pmi"


@pytest.mark.parametrize("env, lobby, replacement", [
    ({}, None, False),
    ({"ALLREDUCE_LOBBY": "", "ALLREDUCE_REPLACEMENT": "0"}, None, False),
    ({"ALLREDUCE_LOBBY": "127.0.0.1:4242", "ALLREDUCE_REPLACEMENT": "1"}, "127.0.0.1:4242", True),
])
def test_growth_of_the_job_from_the_launcher(env, lobby, replacement):
    assert (rdv.lobby_address(env), rdv.is_replacement(env)) == (lobby, replacement)


@pytest.mark.parametrize("env, words", [
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be below WORLD_SIZE=2"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 must be at least 0"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK=3 must be below"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "x"}, "SLURM_NTASKS"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
])
def test_bad_values_name_the_variable(env, words):
    with pytest.raises(ValueError, match=words):
        from_environment(env)


# --- init_method -----------------------------------------------------------------------------


def check_world(results: list, world_size: int) -> None:
    expected = [(r, world_size) for r in range(world_size)]
    assert [r if isinstance(r, Exception) else r[1:] for r in results] == expected
    for store, _, _ in results:
        store.prefix("after").add("n", 1)
    assert results[0][0].prefix("after").get("n") == str(world_size).encode()
    for store, _, _ in sorted(results, key=lambda r: -r[1]):  # rank 0 hosts: it closes last
        store.close()


def test_env_rendezvous_of_four(clean_env):
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    clean_env.setenv("MASTER_PORT", str(free_port()))
    clean_env.setenv("WORLD_SIZE", "4")
    joining = rdv.Joining(from_environment())
    check_world(run_threads(4, lambda r: rendezvous(None, rank=r, timeout=10, joining=joining)), 4)


def test_tcp_rendezvous_of_four(clean_env):
    url = f"tcp://127.0.0.1:{free_port()}"
    check_world(run_threads(4, lambda r: rendezvous(url, r, 4, timeout=10)), 4)


def test_tcp_rendezvous_with_query_parameters(clean_env):
    url = f"tcp://127.0.0.1:{free_port()}?world_size=3"
    check_world(run_threads(3, lambda r: rendezvous(f"{url}&rank={r}", timeout=10)), 3)


def test_file_rendezvous_of_four(clean_env, tmp_path):
    url = f"file://{tmp_path}/job.store"
    check_world(run_threads(4, lambda r: rendezvous(url, r, 4, timeout=10)), 4)


def test_world_of_one_on_port_zero(clean_env):
    store, rank, size = rendezvous("tcp://127.0.0.1:0", 0, 1, timeout=5)
    assert (rank, size, store.port > 0) == (0, 1, True)
    store.close()


def test_world_size_disagreement(clean_env, tmp_path):
    url = f"file://{tmp_path}/job.store"
    results = run_threads(2, lambda r: rendezvous(url, r, 2 + r, timeout=5))
    assert all(isinstance(r, RendezvousError) for r in results)
    assert "rank 1 has 3" in str(results[0]) and "rank 0 has world_size 2" in str(results[1])


def test_timeout_says_how_many_joined(clean_env, tmp_path):
    url = f"file://{tmp_path}/job.store"
    with pytest.raises(CommTimeout, match=r"1 of 3 ranks joined \(missing: ranks 1, 2\)"):
        rendezvous(url, 0, 3, timeout=0.2)
    with pytest.raises(CommTimeout, match="rank 1/2: rendezvous at FileStore.* 1 of 2 ranks joined"):
        rendezvous(f"file://{tmp_path}/other.store", 1, 2, timeout=0.2)


def test_stale_file_is_detected(clean_env, tmp_path):
    url = f"file://{tmp_path}/job.store"
    for store, *_ in run_threads(2, lambda r: rendezvous(url, r, 2, timeout=5)):
        store.close()
    results = run_threads(2, lambda r: rendezvous(url, r, 2, timeout=5))
    assert all(isinstance(r, RendezvousError) and "earlier job" in str(r) for r in results)


def test_file_of_a_group_that_ended_is_stale_at_once(clean_env, tmp_path):
    """Ranks that left count out under LEFT_KEY; a file store cannot be dialled again, so it is stale."""
    url = f"file://{tmp_path}/job.store"
    for store, *_ in run_threads(2, lambda r: rendezvous(url, r, 2, timeout=5)):
        store.add(rdv.LEFT_KEY, 1)
        store.close()
    start = time.monotonic()
    results = run_threads(2, lambda r: rendezvous(url, r, 2, timeout=5))
    assert all(isinstance(r, RendezvousError) and "group that ended" in str(r) for r in results), results
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("init_method, rank, world_size, error, words", [
    ("udp://127.0.0.1:1", 0, 1, ValueError, "known schemes: env://, file://, tcp://"),
    ("tcp://127.0.0.1", 0, 1, ValueError, "host:port"),
    ("tcp://127.0.0.1:port", 0, 1, ValueError, "host:port"),
    ("tcp://127.0.0.1:0", 0, 2, ValueError, "port 0"),
    ("file://relative/path", 0, 1, ValueError, "absolute path"),
    ("tcp://127.0.0.1:1?rank=x", -1, 1, ValueError, "rank='x'"),
    ("tcp://127.0.0.1:1?rank=1", 0, 2, ValueError, "disagrees"),
    ("tcp://127.0.0.1:1", -1, 2, ValueError, "set RANK"),
    ("tcp://127.0.0.1:1", 0, -1, ValueError, "set WORLD_SIZE"),
    ("tcp://127.0.0.1:1", 2, 2, ValueError, "not in a world of 2"),
    ("tcp://127.0.0.1:1", -2, 2, ValueError, "rank must be"),
    (None, -1, -1, ValueError, "set RANK"),
])
def test_init_method_errors(clean_env, init_method, rank, world_size, error, words):
    with pytest.raises(error, match=words):
        rendezvous(init_method, rank, world_size, timeout=1)


def test_one_default_timeout(clean_env, tmp_path):
    """Every store, and the rendezvous, wait as long as a group does unless told otherwise."""
    store, _, _ = rendezvous(f"file://{tmp_path}/s", 0, 1)
    with HashStore() as memory, TCPStore("127.0.0.1", 0, is_server=True) as tcp, store:
        assert memory.timeout == tcp.timeout == store.timeout == DEFAULT_TIMEOUT == 600


def test_rank_and_size_from_the_environment(clean_env, tmp_path):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    store, rank, size = rendezvous(f"file://{tmp_path}/s", timeout=5, joining=rdv.Joining(from_environment()))
    assert (rank, size) == (0, 1)
    store.close()


def test_register_scheme(clean_env):
    made = []
    rdv.register_scheme("mem", lambda url, rank, size, timeout, joining: made.append(HashStore(timeout)) or made[-1])
    try:
        store, rank, size = rendezvous("mem://", 0, 1, timeout=5)
        assert store is made[0] and store.get("rendezvous/verdict") == b""
        with pytest.raises(ValueError, match="already registered"):
            rdv.register_scheme("mem", lambda *a: HashStore())
    finally:
        rdv.unregister_scheme("mem")
    with pytest.raises(ValueError, match="unknown scheme; known schemes: env://, file://, tcp://"):
        rendezvous("mem://", 0, 1, timeout=5)
    with pytest.raises(ValueError, match="not registered"):
        rdv.unregister_scheme("mem")
    with pytest.raises(ValueError, match="not a URL scheme"):
        rdv.register_scheme("Bad Name", lambda *a: HashStore())
