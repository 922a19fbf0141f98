"""A store host out of file descriptors rests instead of spinning on ``accept``, and lets the waiting
client in once descriptors are free again.

(Before, ``EMFILE`` from ``accept()`` was taken for "nothing to accept" while the connection stayed
queued, so the server thread spun at a full core until the client gave up.)
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time

from support.descriptors import exhaust, restore
from support.harness import free_port

from allreduce.rendezvous import TCPStore

_CTX = mp.get_context("fork")
WATCH_S = 1.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _host(port: int, starved, dialed, out) -> None:
    store = TCPStore("127.0.0.1", port, is_server=True, timeout=10)
    limits, fillers = exhaust()
    starved.set()
    dialed.wait(10)
    time.sleep(0.2)  # the client's connection waits in the backlog
    before = _cpu()
    time.sleep(WATCH_S)
    out.put(_cpu() - before)
    restore(limits, fillers)
    time.sleep(5)  # serves the client
    store.close()


def test_a_store_host_out_of_descriptors_does_not_spin_and_serves_later():
    port = free_port()
    starved, dialed, out = _CTX.Event(), _CTX.Event(), _CTX.Queue()
    host = _CTX.Process(target=_host, args=(port, starved, dialed, out), daemon=True)
    host.start()
    try:
        assert starved.wait(10)
        dialed.set()
        client = TCPStore("127.0.0.1", port, timeout=10)  # gets in once the host has descriptors again
        client.set("k", b"v")
        assert client.get("k") == b"v"
        client.close()
        assert out.get(timeout=10) < 0.3 * WATCH_S
    finally:
        host.kill()
        host.join()
