"""Authentication: the challenge-response itself (pure), over sockets, and on every kind of connection."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from support.harness import free_port, run_ranks

from support.paths import SRC
import allreduce as dist
from allreduce import auth, security

from allreduce.errors import PeerLost, ProtocolError, RendezvousError
from allreduce.rendezvous import HashStore, TCPStore
from allreduce.security import Security
from allreduce.settings import Settings
from allreduce.transport import mesh, tcp

KEY, OTHER = b"the job secret", b"another secret"
CONTEXT = b"peer:test"


def handshake(client_key: bytes, server_key: bytes, client_context: bytes = CONTEXT,
              server_context: bytes = CONTEXT):
    """Run the three messages in memory; return (server passed, client error or None)."""
    server_nonce, greeting = auth.challenge()
    responder = auth.Responder(server_key, server_context)
    responder._nonce, responder.greeting = server_nonce, greeting
    client_nonce, response = auth.respond(client_key, client_context, auth.read_challenge(greeting))
    reply, rest = responder.feed(response)
    try:
        if reply == auth.REFUSAL:
            raise auth.AuthError("refused")
        auth.check_proof(client_key, client_context, server_nonce, client_nonce, reply)
    except auth.AuthError as exc:
        return responder.passed, exc
    return responder.passed, None


def test_same_key_passes_both_ways():
    assert handshake(KEY, KEY) == (True, None)


@pytest.mark.parametrize("client_key,server_key,client_context", [
    (OTHER, KEY, CONTEXT),  # the client does not know the secret
    (KEY, KEY, b"peer:other"),  # a proof made for another link
])
def test_client_without_the_secret_is_refused(client_key, server_key, client_context):
    passed, error = handshake(client_key, server_key, client_context)
    assert passed is False and error is not None


def test_server_without_the_secret_is_caught_by_the_client():
    server_nonce, greeting = auth.challenge()
    client_nonce, response = auth.respond(KEY, CONTEXT, auth.read_challenge(greeting))
    forged = auth.prove(OTHER, CONTEXT, server_nonce, client_nonce)
    with pytest.raises(auth.AuthError, match="server's proof is wrong"):
        auth.check_proof(KEY, CONTEXT, server_nonce, client_nonce, forged)


def test_a_recorded_response_is_useless_against_a_fresh_challenge():
    first = auth.Responder(KEY, CONTEXT)
    _, response = auth.respond(KEY, CONTEXT, auth.read_challenge(first.greeting))
    assert first.feed(response)[0] != auth.REFUSAL and first.passed
    replayed = auth.Responder(KEY, CONTEXT)  # a new connection: a new server nonce
    assert replayed.feed(response) == (auth.REFUSAL, b"") and replayed.passed is False


def test_one_sides_proof_cannot_be_reflected_as_the_others():
    server_nonce, client_nonce = os.urandom(32), os.urandom(32)
    client_mac = auth._mac(KEY, b"client", CONTEXT, server_nonce, client_nonce)
    with pytest.raises(auth.AuthError):
        auth.check_proof(KEY, CONTEXT, server_nonce, client_nonce, client_mac)
    assert auth.prove(KEY, CONTEXT, server_nonce, client_nonce) != client_mac


def test_responder_takes_bytes_in_pieces_and_holds_no_more_than_a_response():
    responder = auth.Responder(KEY, CONTEXT)
    _, response = auth.respond(KEY, CONTEXT, auth.read_challenge(responder.greeting))
    for i in range(len(response) - 1):
        assert responder.feed(response[i:i + 1]) == (None, b"")
    reply, rest = responder.feed(response[-1:] + b"first request")
    assert responder.passed and rest == b"first request" and len(reply) == auth.PROOF_SIZE
    flood = auth.Responder(KEY, CONTEXT)
    assert flood.feed(bytes(10 << 20)) == (auth.REFUSAL, b"")
    assert len(flood._got) == auth.RESPONSE_SIZE


@pytest.mark.parametrize("message,words", [
    (b"ARau\x01" + bytes(31), "must be 37 bytes"),
    (b"HTTP/" + bytes(32), "not an allreduce server"),
    (b"ARau\x09" + bytes(32), "version 9"),
])
def test_bad_challenges_are_protocol_errors(message, words):
    with pytest.raises(ProtocolError, match=words):
        auth.read_challenge(message)


def test_a_secret_or_tls_proves_membership_and_one_host_trusts_uids():
    assert not Security().proven and Security(b"abc").among(1).proven
    assert Security().among(1).one_host and not Security().among(2).one_host
    assert security.trusted(Settings(), 1) and not security.trusted(Settings(), 2)
    assert security.trusted(Settings(secret="abc"), 2)
    assert security.trusted(Settings(tls_cert="c", tls_key="k", tls_ca="ca"), 2)


def test_key_comes_from_the_environment_with_a_public_fallback():
    assert Security.of(Settings.from_env({"ALLREDUCE_SECRET": "abc"})).key == auth.job_key("abc") == b"abc"
    assert Security.of(Settings.from_env({})).key == auth.job_key("") == Security().key != b"abc"
    assert "abc" not in repr(Settings(secret="abc")) and "abc" not in repr(Security(b"abc"))


def test_warning_only_for_exposed_addresses_without_a_secret(caplog, monkeypatch):
    monkeypatch.setattr(auth, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="allreduce"):
        for host in ("127.0.0.1", "localhost", "::1"):
            auth.warn_if_exposed(host, auth.PUBLIC_KEY)
        auth.warn_if_exposed("10.1.2.3", b"s")
        assert not caplog.records
        auth.warn_if_exposed("0.0.0.0", auth.PUBLIC_KEY)
        auth.warn_if_exposed("10.1.2.3", auth.PUBLIC_KEY)
    assert len(caplog.records) == 1 and "ALLREDUCE_SECRET" in caplog.records[0].getMessage()


# ---- over a socket --------------------------------------------------------------------------------

def over_socketpair(client_key: bytes, server_key: bytes, server=auth.server_handshake):
    """Run both blocking halves on a socket pair; return what each raised (or None)."""
    a, b = socket.socketpair()
    errors = {}

    def side(name, fn, sock, key):
        try:
            fn(sock, key, CONTEXT, time.monotonic() + 5)
            errors[name] = None
        except Exception as exc:  # collected for the assertions
            errors[name] = exc

    threads = [threading.Thread(target=side, args=("server", server, a, server_key)),
               threading.Thread(target=side, args=("client", auth.client_handshake, b, client_key))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    a.close()
    b.close()
    return errors


def test_blocking_halves_agree():
    assert over_socketpair(KEY, KEY) == {"server": None, "client": None}


def test_blocking_halves_both_fail_on_different_secrets():
    errors = over_socketpair(OTHER, KEY)
    assert isinstance(errors["server"], auth.AuthError)
    assert isinstance(errors["client"], auth.AuthError) and "ALLREDUCE_SECRET" in str(errors["client"])


def test_a_server_that_does_not_admit_the_client_says_it_is_another_users():
    errors = over_socketpair(KEY, KEY, lambda *args: auth.server_handshake(*args, admits=lambda sock: False))
    assert isinstance(errors["server"], auth.AuthError)
    assert isinstance(errors["client"], auth.AuthError) and "another user's process" in str(errors["client"])


def test_silent_server_times_out_at_the_deadline():
    a, b = socket.socketpair()
    with a, b:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            auth.client_handshake(b, KEY, CONTEXT, time.monotonic() + 0.2)
        assert time.monotonic() - start < 1.0


# ---- the store -----------------------------------------------------------------------------------

def test_store_refuses_a_client_with_another_secret():
    right, wrong = Security(b"right"), Security(b"wrong")
    with TCPStore("127.0.0.1", 0, is_server=True, timeout=5, security=right) as server:
        with pytest.raises(RendezvousError, match="refused our proof.*ALLREDUCE_SECRET"):
            TCPStore("127.0.0.1", server.port, timeout=5, security=wrong)
        with TCPStore("127.0.0.1", server.port, timeout=5, security=right) as client:
            client.set("k", b"v")
        assert server.get("k") == b"v"


def test_client_sees_a_store_that_does_not_know_the_secret():
    with TCPStore("127.0.0.1", 0, is_server=True, timeout=5, security=Security(b"impostor")) as server:
        listener = server._server._listener.getsockname()
        with pytest.raises(RendezvousError, match="cannot join the store"):
            TCPStore(*listener, timeout=5, security=Security(b"real"))


def test_store_client_fails_fast_once_its_server_is_gone():
    server = TCPStore("127.0.0.1", 0, is_server=True, timeout=30)
    client = TCPStore("127.0.0.1", server.port, timeout=30)
    server.close()
    start = time.monotonic()
    for _ in range(2):  # the pooled connection sees the close, a new one is refused
        with pytest.raises(PeerLost):
            client.set("k", b"v")
    assert time.monotonic() - start < 2
    client.close()


# ---- peer links ----------------------------------------------------------------------------------

def test_peer_link_with_another_secret_is_refused_and_the_group_forms_without_it():
    store = HashStore(timeout=10)
    done = {}

    def rank(r):
        done[r] = tcp.TcpTransport.connect(r, 2, store, "127.0.0.1", "default", 10, Security())

    zero = threading.Thread(target=rank, args=(0,))
    zero.start()
    with pytest.raises(RendezvousError, match="could not authenticate with rank 0.*ALLREDUCE_SECRET"):
        peering = tcp.TcpPeering(1, 2, "127.0.0.1", "default", Security(b"not the key"))
        mesh.dial(peering, store, 0, time.monotonic() + 5)
    rank(1)
    zero.join(10)
    assert sorted(done) == [0, 1]
    for transport in done.values():
        transport.close()


def _with_secret(secrets: dict[int, str], port: int):
    def body(rank, size):
        os.environ["ALLREDUCE_SECRET"] = secrets[rank]
        try:
            dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=2)
        except dist.AllreduceError as exc:
            return type(exc).__name__, str(exc)
        x = np.full(3, rank + 1.0)
        dist.all_reduce(x)
        dist.destroy_process_group()
        return x.tolist()
    return body


def test_rank_with_another_secret_cannot_join_and_says_why():
    results = run_ranks(_with_secret({0: "a", 1: "b", 2: "a"}, free_port()), 3, init=False, deadline=30)
    kind, message = results[1]
    assert kind == "RendezvousError" and "ALLREDUCE_SECRET" in message, message
    for kind, message in (results[0], results[2]):  # the others only see it missing, at the deadline
        assert kind in ("CommTimeout", "PeerLost", "RendezvousError"), message


def test_ranks_with_the_same_secret_work():
    assert run_ranks(_with_secret({0: "s", 1: "s"}, free_port()), 2, init=False) == [[3.0] * 3] * 2


def _bound_addresses(rank, size):
    store = dist.default_group().store
    addresses = [store.get(f"tcp/{r}").decode() for r in range(size)]
    server = getattr(store, "_server", None)
    dist.barrier()  # the store host stays until everyone has read
    return addresses, server._listener.getsockname()[0] if server else None


def test_servers_bind_loopback_in_a_single_host_job():
    results = run_ranks(_bound_addresses, 2, env={"ALLREDUCE_TRANSPORT": "tcp"})
    for addresses, _ in results:
        assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
    assert results[0][1] == "127.0.0.1"


def test_allreduce_run_gives_every_worker_one_fresh_secret():
    src = str(SRC)
    env = {k: v for k, v in os.environ.items() if k != "ALLREDUCE_SECRET"}
    env["PYTHONPATH"] = src
    show = [sys.executable, "-c", "import os; print(os.environ['ALLREDUCE_SECRET'])"]

    def secrets_seen(env):
        out = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "2", "--", *show], env=env,
                             capture_output=True, text=True, timeout=60).stdout
        return [line.split()[1] for line in sorted(out.splitlines())]

    runs = [secrets_seen(env) for _ in range(2)]
    for secrets in runs:
        assert len(secrets) == 2 and secrets[0] == secrets[1] and len(secrets[0]) == 64, secrets
    assert runs[0][0] != runs[1][0]
    assert secrets_seen(dict(env, ALLREDUCE_SECRET="chosen")) == ["chosen", "chosen"]
