"""Every survivor's error names the rank that was killed, at 4 and 5 ranks with 64 MiB all-reduces.

A survivor next to the dead rank sees its link close; the others hear it from a survivor that gave up
first: in that survivor's ABORT frame, or in the store under ``failed/{rank}``. The victim is rank 0
(the store host, so the store is gone too) or a rank in the middle of the ring.
"""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks

import allreduce as dist

pytestmark = engines.BOTH  # the lines run in Python and in C

COUNT = 16 << 20  # float32: 64 MiB


def _killed(victim: int):
    def body(rank, size):
        x = np.ones(COUNT, np.float32)
        dist.all_reduce(x, dist.ReduceOp.MAX)  # warm: every link up
        if rank == victim:
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
        try:
            for _ in range(20):
                dist.all_reduce(x, dist.ReduceOp.MAX)
        except dist.AllreduceError as exc:
            return type(exc).__name__, str(exc)
        return "no error", ""
    return body


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("size,victim", [(4, 0), (4, 2), (5, 0), (5, 2)])
def test_every_survivor_names_the_killed_rank(size, victim, transport):
    results = run_ranks(_killed(victim), size, timeout=20, deadline=60, expect_errors=True,
                        env={"ALLREDUCE_TRANSPORT": transport})
    assert results[victim] == ("killed", -signal.SIGKILL), results[victim]
    unnamed = [(rank, outcome) for rank, outcome in enumerate(results)
               if rank != victim and (outcome[0] == "no error" or f"rank {victim}" not in outcome[1])]
    assert not unnamed, unnamed
