"""A rank out of file descriptors fails at once with an error naming the resource, and its peers hear of it
in seconds: never a progress thread spinning on ``accept`` and a timeout that blames the peer.

(Before, ``EMFILE`` from ``accept()`` was taken for "nothing to accept" and dials retried it silently,
so both ranks waited the group's whole timeout.)
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.descriptors import exhaust, restore
from support.harness import run_ranks

import allreduce as dist

TIMEOUT = 60.0  # the group's: an error must come long before it
FAST_S = 15.0


def _exhausted(call):
    """``call(rank)`` on both ranks, rank 1 left without a free descriptor: (its outcome, seconds it took)."""
    def body(rank, size):
        dist.barrier()
        start = time.monotonic()
        if rank == 1:
            limits, fillers = exhaust()
        try:
            call(rank)
            outcome = "no error", ""
        except dist.AllreduceError as exc:
            outcome = type(exc).__name__, str(exc)
        finally:
            if rank == 1:
                restore(limits, fillers)
        return outcome, time.monotonic() - start
    return body


def _first_message(source):
    """Rank 0 sends its first message to rank 1, which then has no descriptor to accept or dial with."""
    def call(rank):
        x = np.ones(4, np.float32)
        if rank == 0:
            time.sleep(0.5)  # rank 1 has no descriptor left by then
            dist.send(x, dst=1)
        else:
            dist.recv(x, src=source)  # from any rank: it only accepts; from rank 0: it dials it too
    return call


def _check(results) -> None:
    for (kind, message), took in results:
        assert kind != "no error" and kind != "CommTimeout", (kind, message)
        assert took < FAST_S, (kind, message, took)
        assert "out of file descriptors (EMFILE, ulimit -n" in message, message


@pytest.mark.parametrize("source", [None, 0])
def test_a_rank_out_of_descriptors_fails_at_once_and_its_peer_hears_why(source):
    _check(run_ranks(_exhausted(_first_message(source)), 2, timeout=TIMEOUT, deadline=2 * TIMEOUT,
                     env={"ALLREDUCE_TRANSPORT": "tcp"}))


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_rank_out_of_descriptors_fails_to_form_a_group_at_once_and_its_peer_hears_why(transport):
    _check(run_ranks(_exhausted(lambda rank: dist.new_group()), 2, timeout=TIMEOUT, deadline=2 * TIMEOUT,
                     env={"ALLREDUCE_TRANSPORT": transport}))
