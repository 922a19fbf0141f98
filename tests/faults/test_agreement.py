"""Ranks that would run different schedules must all raise ``Mismatch`` in the call, never return sums.

Two algorithms can exchange frames of the same sizes in the same steps and still compute different
things (at 2 ranks, 8 of the 56 ordered pairs of all-reduce algorithms returned different wrong sums
and exit 0). One job per world size and transport runs every ordered pair on a fresh subgroup (a
failure breaks only that subgroup): rank 0 calls ``all_reduce`` with the first algorithm, the others
with the second.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from support.harness import run_ranks

import allreduce as dist
from allreduce import algorithms

PAIRS = list(itertools.permutations(algorithms.names("all_reduce"), 2))


def _every_pair(rank, size):
    outcomes = {}
    for first, second in PAIRS:
        group = dist.new_group(list(range(size)), timeout=2.0)
        x = np.arange(1000, dtype=np.float32) + rank
        start = time.monotonic()
        try:
            dist.all_reduce(x, group=group, algorithm=first if rank == 0 else second)
            outcomes[first, second] = ("no error", str(x[:4]), time.monotonic() - start)
        except dist.AllreduceError as exc:
            outcomes[first, second] = (type(exc).__name__, str(exc), time.monotonic() - start)
        dist.destroy_process_group(group)
    return outcomes


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("size", [2, 3])
def test_ranks_that_disagree_on_the_algorithm_all_raise_mismatch(size, transport):
    results = run_ranks(_every_pair, size, timeout=30, deadline=280, env={"ALLREDUCE_TRANSPORT": transport})
    wrong = [(first, second, rank, outcome) for first, second in PAIRS for rank, outcome in
             enumerate(r[first, second] for r in results)
             if outcome[0] != "Mismatch" or first not in outcome[1] or second not in outcome[1] or outcome[2] > 5.0]
    assert not wrong, f"{len(wrong)} of {len(PAIRS) * size} rank outcomes: " + "\n".join(map(str, wrong[:10]))
