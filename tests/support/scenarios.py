"""Failure scenarios that every transport must survive; each returns what a rank saw."""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import allreduce as dist


def killed_mid_collective(rank, size):
    x = np.ones(4 << 20, np.float32)
    dist.all_reduce(x)  # warm: everyone connected and working
    if rank == 1:
        work = dist.all_reduce(x, async_op=True)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
        work.wait()
    start = time.monotonic()
    try:
        for _ in range(20):
            dist.all_reduce(x)
    except dist.AllreduceError as exc:
        return time.monotonic() - start, type(exc).__name__, str(exc)
    return None


def mismatched(kind):
    def body(rank, size):
        x = np.ones(10, np.float32)
        try:
            if kind == "count":
                dist.all_reduce(np.ones(10 + rank, np.float32))
            elif kind == "dtype":
                dist.all_reduce(np.ones(10, np.float32 if rank else np.float64))
            elif kind == "op":
                dist.all_reduce(x, op=dist.ReduceOp.MAX if rank else dist.ReduceOp.SUM)
            elif kind == "order":
                if rank:
                    dist.broadcast(x, src=0)
                    dist.all_reduce(x)
                else:
                    dist.all_reduce(x)
                    dist.broadcast(x, src=0)
        except dist.AllreduceError as exc:
            return type(exc).__name__, str(exc)
        return "no error", x.tolist()
    return body
