"""The per-shape shortcut of a blocking all-reduce (a shape the group ran before goes straight to its
planned call) keeps what the general path guarantees: the result, deterministic mode switched on
after the shape was remembered, the one-thread rule, and a broken group's refusal."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks
from support.reference import left_fold_misses

import allreduce as dist

pytestmark = engines.BOTH


def _then_deterministic(rank: int, size: int) -> list[str]:
    wrong = []
    for _ in range(3):  # every shape left_fold_misses uses, remembered in the default (fast) mode
        left_fold_misses(lambda x, op: dist.all_reduce(x, op=op), rank, size, 301)
    dist.use_deterministic_algorithms(True)
    wrong += left_fold_misses(lambda x, op: dist.all_reduce(x, op=op), rank, size, 301)
    x = np.arange(5, dtype=np.int64)
    for _ in range(3):
        dist.all_reduce(x)
    if x.tolist() != [i * size ** 3 for i in range(5)]:
        wrong.append(f"int64 {x.tolist()}")
    return wrong


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_deterministic_mode_set_after_a_shape_was_remembered_still_folds_in_rank_order(transport):
    assert run_ranks(_then_deterministic, 3, env={"ALLREDUCE_TRANSPORT": transport}) == [[]] * 3


def _second_thread(rank: int, size: int) -> str:
    x = np.ones(4, np.float32)
    dist.all_reduce(x)  # the shape is remembered
    work = dist.all_reduce(np.ones(4, np.float32), async_op=True) if rank == 0 else None
    seen = []

    def other():
        try:
            dist.all_reduce(x)
            seen.append("no error")
        except RuntimeError as exc:
            seen.append(str(exc))

    if rank == 0:
        thread = threading.Thread(target=other, name="intruder")
        thread.start()
        thread.join()
        try:
            work.wait()
        except Exception as exc:  # the call in flight fails with the conflict
            seen.append(type(exc).__name__)
        return " | ".join(seen)
    time.sleep(0.5)  # rank 0's async call waits for this one meanwhile: its calls are in flight
    try:
        dist.all_reduce(np.ones(4, np.float32))
    except dist.AllreduceError:
        pass
    return ""


def test_a_remembered_shape_from_a_second_thread_is_refused():
    results = run_ranks(_second_thread, 2, timeout=10, expect_errors=True)
    assert "while thread 'MainThread' has calls in flight" in results[0], results
