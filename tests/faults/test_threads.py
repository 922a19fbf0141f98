"""Any thread may use a group, one at a time. Two threads at once raise in the late one and break the
group, so no rank keeps a result paired across threads; a blocking call from a ``Work`` callback on the
progress thread raises instead of waiting for itself.

Calls from two threads at once would be numbered in a different order on different ranks and pair up
wrongly (two threads' same-sized all-reduces used to return each other's sums), and a blocking call from
a callback waited on the queue its own thread serves, forever.
"""

from __future__ import annotations

import threading

import numpy as np
from support import engines
from support.harness import run_ranks

import allreduce as dist

pytestmark = engines.BOTH  # the lines run in Python and in C

CALLS = 5000  # enough to outlast the interpreter's thread switch (5 ms) many times over: small calls take a few us


def _two_threads(rank, size):
    start = threading.Barrier(2, timeout=10)
    outcomes = {}

    def issue(who: str, base: float) -> None:
        start.wait()
        sums = []
        try:
            for _ in range(CALLS):
                x = np.full(1000, base + rank, np.float32)
                dist.all_reduce(x)
                sums.append(float(x[0]))
            outcomes[who] = ("ok", sums)
        except (RuntimeError, dist.AllreduceError) as exc:
            outcomes[who] = (type(exc).__name__, str(exc))

    worker = threading.Thread(target=issue, args=("worker", 1000.0), name="worker")
    worker.start()
    issue("main", 0.0)
    worker.join(30)
    return outcomes


def test_two_threads_at_once_raise_and_no_rank_keeps_a_mixed_result():
    for outcomes in run_ranks(_two_threads, 2, timeout=10, deadline=60, expect_errors=True):
        late = [message for kind, message in outcomes.values() if kind == "RuntimeError"]
        assert len(late) == 1 and "calls from two threads at once" in late[0], outcomes
        for who, (kind, result) in outcomes.items():
            if kind == "ok":  # a thread that finished alone got its own sums only
                assert result == [2 * (1000.0 if who == "worker" else 0.0) + 1.0] * CALLS, outcomes


def _one_thread_after_another(rank, size):
    sums = []

    def issue(base: float) -> None:
        for _ in range(5):
            x = np.full(10, base + rank, np.float32)
            dist.all_reduce(x)
            sums.append(float(x[0]))

    for base in (0.0, 100.0):
        thread = threading.Thread(target=issue, args=(base,))
        thread.start()
        thread.join(30)
    issue(1000.0)
    return sums


def test_threads_may_take_turns_on_a_group():
    expected = [1.0] * 5 + [201.0] * 5 + [2001.0] * 5
    assert run_ranks(_one_thread_after_another, 2, timeout=10, deadline=60) == [expected] * 2


def _group_of_its_own(rank, size):
    out = {}

    def work():
        group = dist.new_group()  # formed here, so this thread's to use
        x = np.full(10, rank + 1.0)
        dist.all_reduce(x, group=group)
        out["sum"] = float(x[0])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(30)
    return out


def test_a_thread_may_use_a_group_it_formed():
    assert run_ranks(_group_of_its_own, 2, timeout=10, deadline=60) == [{"sum": 3.0}] * 2


def _blocking_in_callbacks(rank, size):
    errors = []

    def collective_in_callback(_):
        try:
            dist.all_reduce(np.ones(4))
        except RuntimeError as exc:
            errors.append(str(exc))

    def wait_in_callback(_):
        try:
            later.wait()
        except RuntimeError as exc:
            errors.append(str(exc))

    late = threading.Event().wait if rank else (lambda _: None)  # rank 0's works pend: callbacks on the progress thread
    x = np.ones(4)
    late(0.3)
    work = dist.all_reduce(x, async_op=True)
    if rank == 0:
        work.get_future().add_done_callback(collective_in_callback)
    work.wait(20)
    late(0.3)
    first, later = dist.all_reduce(x, async_op=True), dist.all_reduce(x, async_op=True)
    if rank == 0:
        first.get_future().add_done_callback(wait_in_callback)
    later.wait(20)
    dist.all_reduce(x)  # the group still works, from its own thread
    return errors, x.tolist()


def test_blocking_calls_in_work_callbacks_raise_instead_of_deadlocking():
    (errors, x), (none, y) = run_ranks(_blocking_in_callbacks, 2, timeout=10, deadline=60)
    assert x == y == [16.0] * 4 and none == []
    assert len(errors) == 2, errors
    assert "all_reduce on process group 'default' from a Work callback" in errors[0], errors
    assert "from a Work callback, on the group's progress thread" in errors[1], errors
