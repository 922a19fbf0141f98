"""A blocking point-to-point call cut short by a signal obeys the collectives' rule: the operation is
cancelled where that is clean, else the group breaks; never a later call's message taken by the
abandoned one, never a send delivered later from the refilled buffer.

(Before, an interrupted ``recv`` stayed posted and took the next message, so the retried ``recv`` got
the one after it; an interrupted announced ``send`` was read later from the refilled array.)
"""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from support.harness import run_ranks

import allreduce as dist
from allreduce import MPI

LATE_S = 1.0  # the peer acts this long after the call began
SIGNAL_S = 0.3  # the call is interrupted this long into it
LARGE = 1 << 18  # float32 elements: 1 MiB, announced


class Watchdog(Exception):
    """What the SIGALRM handler raises."""


def _on_alarm(signum, frame):
    raise Watchdog("step took too long")


def _interrupted(call) -> str:
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, SIGNAL_S)
    try:
        call()
    except Watchdog:
        return "interrupted"
    return "returned"


def _retried_receive(api: str):
    def body(rank, size):
        x = np.zeros(4, np.float32)
        if rank == 1:
            time.sleep(LATE_S)
            for value in (1.0, 2.0):
                dist.send(np.full(4, value, np.float32), dst=0, tag=5)
            dist.barrier()
            return None
        receive = (lambda: dist.recv(x, src=1, tag=5)) if api == "torch" else (
            lambda: MPI.COMM_WORLD.Recv(x, source=1, tag=5))
        first = _interrupted(receive)
        got = []
        for _ in range(2):
            receive()
            got.append(float(x[0]))
        dist.barrier()  # the group is still whole
        return first, got
    return body


def test_an_interrupted_blocking_recv_is_cancelled_and_the_retry_gets_the_next_message():
    for api in ("torch", "mpi"):
        first, got = run_ranks(_retried_receive(api), 2, timeout=20, deadline=60)[0]
        assert first == "interrupted"
        assert got == [1.0, 2.0], api


def _refilled_send(api: str):
    return lambda rank, size: _refilled(rank, api)


def _refilled(rank, api: str):
    """Rank 0's announced send (alone, or MPI's Sendrecv, whose receive never matches) is interrupted
    before rank 1 posts its receive, and rank 0 refills the buffer."""
    x = np.ones(LARGE, np.float32)
    if rank == 0:
        sending = (lambda: dist.send(x, dst=1, tag=3)) if api == "torch" else (
            lambda: MPI.COMM_WORLD.Sendrecv(x, dest=1, sendtag=3, recvbuf=np.zeros(1), source=1, recvtag=9))
        first = _interrupted(sending)
        x[:] = 7.0  # the caller reuses its buffer, as after any failed call
        time.sleep(2 * LATE_S)  # alive while the peer posts its receive
        try:
            dist.send(x, dst=1, tag=4)
        except dist.AllreduceError as exc:
            return first, type(exc).__name__
        return first, "no error"
    time.sleep(LATE_S)
    try:
        if api == "torch":
            dist.recv(x, src=0, tag=3)
        else:
            MPI.COMM_WORLD.Recv(x, source=0, tag=3)
    except dist.AllreduceError as exc:
        return type(exc).__name__, str(exc)
    return "no error", int(np.count_nonzero(x == 7.0))


@pytest.mark.parametrize("api", ["torch", "mpi"])
def test_an_interrupted_announced_send_is_never_delivered_from_the_refilled_buffer(api):
    (first, later), (kind, detail) = run_ranks(_refilled_send(api), 2, timeout=20, deadline=60)
    assert first == "interrupted"
    assert later == "GroupBroken"
    assert kind in ("PeerLost", "GroupBroken"), (kind, detail)
    assert "Interrupted" in detail or "interrupted" in detail, detail
