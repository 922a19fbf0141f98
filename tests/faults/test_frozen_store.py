"""A frozen store host: rank 0, which hosts the store, is stopped (SIGSTOP) while the others run.

Every store call a collective makes on its way (heartbeat, mismatch check, stall report, failure
record) and at teardown (the goodbye) is bounded by what is left of its deadline or a short grace,
so the survivors raise soon after the timeout and leave within seconds, instead of waiting a fresh
timeout on each call (3.3 times the timeout in all, and destroy another).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np

import allreduce as dist
from support.harness import run_ranks

TIMEOUT = 3.0


def _store_host_freezes(rank, size):
    pids = np.zeros(size, np.int64)
    pids[rank] = os.getpid()
    dist.all_reduce(pids)
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # until a survivor kills it below
    time.sleep(0.5)  # rank 0 is stopped by now; the heartbeat meets the frozen store meanwhile
    start = time.monotonic()
    try:
        dist.all_reduce(np.ones(10, np.float32))
        error = "no error"
    except dist.AllreduceError as exc:
        error = str(exc)
    failed = time.monotonic() - start
    start = time.monotonic()
    dist.destroy_process_group()
    destroyed = time.monotonic() - start
    with contextlib.suppress(ProcessLookupError):  # the other survivor may have been first
        os.kill(int(pids[0]), signal.SIGKILL)
    return error, failed, destroyed


def test_survivors_of_a_frozen_store_host_fail_in_time_and_leave_at_once():
    results = run_ranks(_store_host_freezes, 3, timeout=TIMEOUT, deadline=60, expect_errors=True)
    assert results[0] == ("killed", -signal.SIGKILL)
    for error, failed, destroyed in results[1:]:
        assert "timed out after 3s waiting for rank 0" in error, error
        assert failed < TIMEOUT + 2.0, (failed, error)
        assert destroyed < 3.0, destroyed
