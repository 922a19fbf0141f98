"""mpi4py's ULFM names on ``allreduce.MPI``: a rank SIGKILLed, the survivors revoke, acknowledge, agree and shrink."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from support.harness import run_ranks

import allreduce as dist
from allreduce import MPI


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_survivors_revoke_ack_agree_and_shrink(transport):
    def body(rank, size):
        comm = MPI.COMM_WORLD
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        y = np.zeros(3, np.int64)
        try:
            for _ in range(100):
                comm.Allreduce(np.ones(3, np.int64), y)
            raise AssertionError("a collective went on without rank 2")
        except dist.AllreduceError:
            comm.Revoke()
        end = time.monotonic() + 10
        while comm.Get_failed().Get_size() == 0 and time.monotonic() < end:
            time.sleep(0.01)
        failed = comm.Get_failed().Translate_ranks()
        try:
            comm.Agree(1)
            unacked = None
        except MPI.Exception as exc:
            unacked = (exc.Get_error_class() == MPI.ERR_PROC_FAILED, exc.flag)
        acked = comm.Ack_failed()
        flag = comm.Agree(rank + 1)  # 1 & 2 & 4 == 0; 1 & 3 & 5 etc: the AND of the survivors' values
        revoked = comm.Is_revoked()
        new = comm.Shrink()
        return revoked, failed, unacked, acked, flag, new.Get_rank(), new.Get_size(), new.allreduce(rank + 1)
    results = run_ranks(body, 4, timeout=600, deadline=60, expect_errors=True, env={"ALLREDUCE_TRANSPORT": transport})
    assert results[2][0] == "killed"
    assert [results[r] for r in (0, 1, 3)] == [(True, [2], (True, 1), 1, 1 & 2 & 4, i, 3, 1 + 2 + 4)
                                               for i in range(3)], results
