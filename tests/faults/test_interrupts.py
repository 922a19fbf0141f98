"""A collective cut short by a signal breaks the group as a communication error does: never a peer that
returns success with wrong data, never a half-sent frame followed by the next call's.

Rank 0 starts a 64 MiB all-reduce or broadcast that cannot finish yet (rank 1 joins a second later, so
rank 0 has sent part of its first frame), and a real signal interrupts it: SIGINT (``KeyboardInterrupt``)
or a SIGALRM whose handler raises, as a watchdog would. Rank 0 catches the exception and carries on with
new data in the same array. (Before, the rest of the half-sent broadcast went out with the next call,
from the new data, and rank 1 returned success with millions of wrong elements.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks

import allreduce as dist

pytestmark = engines.BOTH  # the lines run in Python and in C

COUNT = 16 << 20  # float32: 64 MiB
LATE_S = 1.0  # rank 1 joins this long after rank 0
SIGNAL_S = 0.3  # rank 0 is interrupted this long into its call


class Watchdog(Exception):
    """What a SIGALRM handler raises when a step takes too long."""


def _on_alarm(signum, frame):
    raise Watchdog("step took too long")


def _arm(how: str) -> None:
    if how == "SIGINT":
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(SIGNAL_S, os.kill, (os.getpid(), signal.SIGINT)).start()
    else:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, SIGNAL_S)


def _outcome(collective: str, x: np.ndarray, want: float):
    try:
        if collective == "all_reduce":
            dist.all_reduce(x)
        else:
            dist.broadcast(x, src=0)
    except dist.AllreduceError as exc:
        return type(exc).__name__, str(exc)
    except (KeyboardInterrupt, Watchdog) as exc:
        return type(exc).__name__, ""
    return "no error", int(np.count_nonzero(x != want))


def _interrupted(collective: str, how: str):
    def body(rank, size):
        x = np.full(COUNT, 1.0 if collective == "all_reduce" or rank == 0 else 0.0, np.float32)
        want = 2.0 if collective == "all_reduce" else 1.0
        dist.barrier()
        if rank == 0:
            _arm(how)
        else:
            time.sleep(LATE_S)
        first = _outcome(collective, x, want)
        x[:] = 7.0  # rank 0 carries on as if nothing had happened, with its next data
        return first, _outcome(collective, x, want)
    return body


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("collective,how", [("all_reduce", "SIGINT"), ("all_reduce", "SIGALRM"),
                                            ("broadcast", "SIGINT")])
def test_an_interrupted_collective_breaks_the_group_on_every_rank(collective, how, transport):
    results = run_ranks(_interrupted(collective, how), 2, timeout=20, deadline=60,
                        env={"ALLREDUCE_TRANSPORT": transport})
    (kind, message), (later, _) = results[1]
    assert kind == "PeerLost" and "rank 0" in message, results[1]
    assert later == "GroupBroken", results[1]
    (interrupted, _), (after, message) = results[0]
    assert interrupted == ("KeyboardInterrupt" if how == "SIGINT" else "Watchdog"), results[0]
    assert after == "GroupBroken" and "was interrupted by" in message, message
