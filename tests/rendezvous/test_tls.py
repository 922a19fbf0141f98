"""Optional TLS (``ALLREDUCE_TLS_CERT``/``_KEY``/``_CA``): the store and every TCP link require a
certificate signed by the job's CA, both ways; anything else is refused with an error that says why.

Certificates are made here with the ``openssl`` command (skipped where it is missing).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from support.harness import free_port, run_ranks

import allreduce as dist
from allreduce.errors import RendezvousError
from allreduce.rendezvous.tcpstore import TCPStore
from allreduce.security import Security
from allreduce.settings import Settings
from allreduce.transport.tcp import TcpPeering

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(where, name: str) -> dict[str, str]:
    """A CA and one certificate it signed, as the three variables' values."""
    ca, ca_key = where / f"{name}-ca.pem", where / f"{name}-ca.key"
    csr, cert, key = where / f"{name}.csr", where / f"{name}.pem", where / f"{name}.key"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", f"/CN={name} CA")
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name} rank")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "2")
    return {"ALLREDUCE_TLS_CERT": str(cert), "ALLREDUCE_TLS_KEY": str(key), "ALLREDUCE_TLS_CA": str(ca)}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    where = tmp_path_factory.mktemp("tls")
    return {"job": _ca(where, "job"), "other": _ca(where, "other")}


def _body(rank, size):
    x = np.arange(3 << 18, dtype=np.float32) * (rank + 1)  # 3 MiB: many TLS records per frame
    dist.all_reduce(x)
    peer = dist.irecv(got := np.zeros(1000, np.int64), (rank - 1) % size) if rank % 2 else None
    if rank % 2 == 0 and rank + 1 < size:
        dist.send(np.arange(1000, dtype=np.int64) + rank, rank + 1)
    if peer is not None:
        peer.wait()
        assert np.array_equal(got, np.arange(1000) + rank - 1)
    return x


def test_three_ranks_all_reduce_over_tls(certs):
    results = run_ranks(_body, 3, timeout=30, env={"ALLREDUCE_TRANSPORT": "tcp", **certs["job"]})
    expect = np.arange(3 << 18, dtype=np.float32) * 6
    for x in results:
        np.testing.assert_array_equal(x, expect)


def _use(variables: dict[str, str] | None) -> Security:
    """The security of a rank with these TLS variables, or none."""
    return Security.of(Settings.from_env(variables or {}))


@pytest.fixture
def tls_store(certs):
    """A store host with the job's certificate; yields its port."""
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_server=True, timeout=5, security=_use(certs["job"]))
    yield port
    server.close()


def test_store_refuses_another_cas_certificate_and_plain_clients(certs, tls_store):
    """A rank whose certificate another CA signed cannot join, at once; one without TLS cannot either."""
    start = time.monotonic()
    with pytest.raises(RendezvousError, match="TLS: .*(not signed|refused)"):
        TCPStore("127.0.0.1", tls_store, timeout=5, security=_use(certs["other"]))
    assert time.monotonic() - start < 4, "a refused certificate is final, not retried until the timeout"
    with pytest.raises(RendezvousError, match="ALLREDUCE_TLS"):  # a plain client: not let in
        TCPStore("127.0.0.1", tls_store, timeout=1.5, security=_use(None))
    client = TCPStore("127.0.0.1", tls_store, timeout=5, security=_use(certs["job"]))  # the job's certificate gets in
    client.set("k", b"v")
    assert client.get("k") == b"v"
    client.close()


def test_tls_store_closes_on_a_plain_client_that_speaks(tls_store):
    """Plain bytes where the TLS handshake belongs: the store closes the connection at once."""
    with socket.create_connection(("127.0.0.1", tls_store), timeout=5) as sock:
        sock.sendall(b"\0" * 64)  # a handshake response, as a plain client would send it
        try:
            assert sock.recv(100) == b""
        except ConnectionResetError:
            pass


@pytest.mark.parametrize("dialer", ["other", "plain"])
def test_link_refuses_a_rank_without_the_jobs_certificate(certs, dialer):
    """A rank's listening side drops a dialer whose certificate another CA signed, or that has none; the
    dialer with another CA's certificate says why."""
    listening = TcpPeering(0, 2, "127.0.0.1", "g", _use(certs["job"]))
    listener, address = listening.listen(4)
    dialing = TcpPeering(1, 2, "127.0.0.1", "g", _use(certs["other"] if dialer == "other" else None))
    answered = []
    thread = threading.Thread(target=lambda: answered.append(listening.answer(listener.accept()[0],
                                                                            time.monotonic() + 3)))
    thread.start()
    with pytest.raises(Exception) as caught:
        dialing.dial(0, address, time.monotonic() + 2)
    thread.join(10)
    listener.close()
    assert answered == [None]
    if dialer == "other":
        assert isinstance(caught.value, RendezvousError) and "TLS: " in str(caught.value), caught.value


def test_partial_tls_settings_name_the_missing_variable(certs):
    with pytest.raises(ValueError, match="ALLREDUCE_TLS_CA not set"):
        _use({"ALLREDUCE_TLS_CERT": certs["job"]["ALLREDUCE_TLS_CERT"],
              "ALLREDUCE_TLS_KEY": certs["job"]["ALLREDUCE_TLS_KEY"]})
    assert _use(None).tls is None
