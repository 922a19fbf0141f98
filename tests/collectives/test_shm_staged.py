"""Medium payloads over shared memory: the staged route (copied once into a staging segment the peer
reduces straight out of) beside the cross-memory and inline routes it replaces up to ``staged_max``.

Each run sets ``ALLREDUCE_SHM_STAGED_MAX`` low, so one sweep of sizes crosses every route: inline up
to 64 KiB, staged up to 1 MiB, cross-memory (or inline, where cross-memory is off) above."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from support.harness import run_ranks
from support.reference import make_input, reduced, same

import allreduce as dist
from allreduce.transport import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64")

STAGED = {"ALLREDUCE_TRANSPORT": "shm", "ALLREDUCE_SHM_STAGED_MAX": str(1 << 20)}
NO_CMA = {**STAGED, "ALLREDUCE_SHM_CROSS_MEMORY": "0"}

# (dtype, count): just above inline_max, odd counts in the staged range, then past staged_max
SIZES = ((np.float32, (64 << 10) // 4 + 1), (np.int8, 300_001), (np.float64, 65_537), (np.float32, 262_147),
         (np.float32, (1 << 20) // 4 + 7), (np.int32, 600_011))
OPS = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT)


def _staging_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:allreduce-staging" in line for line in f)


def _sweep(rank, size):
    """Every size, op and a few algorithms, twice over (the second pass reuses staging segments),
    then the largest number of staging mappings this rank holds."""
    wrong, most = [], 0
    for _ in range(2):
        for dtype, count in SIZES:
            for op in OPS:
                inputs = [make_input(dtype, count, r, op) for r in range(size)]
                for algo in ("ring", "rabenseifner", "direct", "recursive_doubling"):
                    x = inputs[rank].copy()
                    dist.all_reduce(x, op=op, algorithm=algo)
                    if not same(x, reduced(op, inputs)):
                        wrong.append(f"all_reduce {algo} {op.name} {np.dtype(dtype)} {count}")
            gathered = np.empty(size * count, dtype)
            mine = make_input(dtype, count, rank)
            dist.all_gather_into_tensor(gathered, mine, algorithm="direct")
            if not same(gathered, np.concatenate([make_input(dtype, count, r) for r in range(size)])):
                wrong.append(f"all_gather direct {np.dtype(dtype)} {count}")
            most = max(most, _staging_maps())
    return wrong, most


@pytest.mark.parametrize("size", [2, 3])
def test_medium_sizes_cross_every_route(size):
    for wrong, most in run_ranks(_sweep, size, env=STAGED, deadline=180):
        assert wrong == []
        assert 1 <= most <= 8 * size  # the staged route ran, and reused its segments rather than grew


def test_medium_sizes_without_cross_memory():
    for wrong, _ in run_ranks(_sweep, 2, env=NO_CMA, deadline=180):
        assert wrong == []


def _mismatched_medium(rank, size):
    try:
        dist.all_reduce(np.ones(200_000 + rank, np.float32), algorithm="ring")
    except dist.AllreduceError as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def test_mismatch_on_the_staged_route():
    for kind, message in run_ranks(_mismatched_medium, 2, timeout=20, env=STAGED, expect_errors=True):
        assert kind in ("Mismatch", "PeerLost"), (kind, message)
        assert "count" in message, message


def _dies_mid_medium(rank, size):
    x = np.ones(200_000, np.float32)
    dist.all_reduce(x)
    if rank == 1:
        os._exit(3)
    start = time.monotonic()
    try:
        dist.all_reduce(x)
    except dist.AllreduceError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", 0.0


def test_dead_peer_on_the_staged_route():
    results = run_ranks(_dies_mid_medium, 2, timeout=20, env=STAGED, expect_errors=True)
    kind, message, elapsed = results[0]
    assert kind in ("PeerLost", "GroupBroken"), results
    assert "rank 1" in message and elapsed < 2.0, results[0]
