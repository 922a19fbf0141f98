"""Hostile and heavy load on the store's host: a client that fills it, and a port full of idle sockets.

The store runs in a process of its own (or in rank 0 of a real job) and the clients are real sockets:
a limit must hold against what arrives over the wire, and the host must stay up and keep serving.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import allreduce as dist
from allreduce.rendezvous import StoreLimits, TCPStore
from support.harness import free_port, run_ranks

MiB = 1 << 20


def _host(port: int, limits: StoreLimits) -> None:
    with TCPStore("127.0.0.1", port, is_server=True, timeout=30, limits=limits):
        time.sleep(120)  # until the test kills us


@pytest.fixture
def host():
    """Start a store host process with the given limits; yield its pid and a client of it."""
    started = []

    def start(limits: StoreLimits = StoreLimits()):
        port = free_port()
        process = mp.get_context("fork").Process(target=_host, args=(port, limits), daemon=True)
        process.start()
        started.append(process)
        return process.pid, TCPStore("127.0.0.1", port, timeout=30)

    yield start
    for process in started:
        process.kill()
        process.join()


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the host's memory from /proc")
def test_a_client_cannot_grow_the_host_without_bound(host):
    pid, client = host()
    client.set("warm", b"up")  # the host is serving: what it holds now is the forked test process's memory
    before = _rss_mib(pid)
    value = bytes(16 * MiB)
    stored = 0
    with pytest.raises(ValueError, match=r"over its limit of 268435456 \(StoreLimits.max_bytes") as refused:
        for stored in range(40):  # 640 MiB asked for
            client.set(f"blob/{stored}", value)
    assert stored == 15, refused.value  # 15 x 16 MiB fit in 256 MiB beside the keys
    assert _rss_mib(pid) - before < 256 + 160  # the stored values, and room for one refused frame
    client.set("small", b"still serving")  # the host stays up, and small keys still fit
    assert client.get("small") == b"still serving"
    assert client.delete_key("blob/0")
    client.set(f"blob/{stored}", value)  # room again once a key is gone
    client.close()


def test_value_limit_is_the_hosts_and_named(host):
    _, client = host(StoreLimits(max_value=MiB))
    with pytest.raises(ValueError, match=r"2097152 bytes is over the store's limit of 1048576 bytes per value"):
        client.set("big", bytes(2 * MiB))
    client.set("fits", bytes(MiB))
    with pytest.raises(ValueError, match="1 to 4096 bytes"):
        client.set("k" * 4097, b"")
    client.close()


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_value"):
        StoreLimits(max_value=(64 * MiB) + 1)
    with pytest.raises(ValueError, match="max_bytes"):
        StoreLimits(max_bytes=0)


# ---- a port full of idle sockets ---------------------------------------------------------------

IDLE = 256  # what once filled the host's room for clients mid-handshake


def _flood(port: int, ready: Path, sockets: list) -> None:
    """Open ``IDLE`` connections to the store once it listens, say nothing on them, then touch ``ready``."""
    while not sockets:
        try:
            sockets.append(socket.create_connection(("127.0.0.1", port)))
        except ConnectionRefusedError:
            time.sleep(0.01)
    sockets.extend(socket.create_connection(("127.0.0.1", port)) for _ in range(IDLE - 1))
    ready.touch()


def _join_after(ready: Path, port: int):
    def body(rank, size):
        while rank and not ready.exists():
            time.sleep(0.01)
        start = time.monotonic()
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=30)
        joined = time.monotonic() - start
        x = np.full(3, rank + 1.0)
        dist.all_reduce(x)
        dist.destroy_process_group()
        return x.tolist(), joined
    return body


def test_ranks_get_in_past_idle_unauthenticated_sockets(tmp_path):
    """Ranks 1 and 2 join once 256 idle sockets sit on the port: the host pushes the oldest out
    (it would close them only after 10 s of silence), so the join takes well under that."""
    port, ready, sockets = free_port(), tmp_path / "flooded", []
    flood = threading.Thread(target=_flood, args=(port, ready, sockets), daemon=True)
    flood.start()
    try:
        results = run_ranks(_join_after(ready, port), 3, init=False, deadline=60)
    finally:
        flood.join(timeout=10)
        for sock in sockets:
            sock.close()
    assert len(sockets) == IDLE
    for total, joined in results[1:]:
        assert total == [6.0] * 3
        assert joined < 5.0, joined
