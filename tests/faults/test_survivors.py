"""What survivors can do on real processes: know who failed, agree while members die, revoke, shrink subgroups.

Agreement values are every bit but the contributor's own, so the AND says who contributed: each
survivor's bit must be cleared, and every survivor must return the same decisions in the same order.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import numpy as np
import pytest
from support.harness import on_hosts, run_ranks

import allreduce as dist

ALL = (1 << 16) - 1


def _wait_failed(expected: list[int], group=None, within: float = 10.0) -> list[int]:
    end = time.monotonic() + within
    while (failed := dist.failed_ranks(group)) != expected and time.monotonic() < end:
        time.sleep(0.01)
    return failed


def test_failed_ranks_names_the_dead_and_agree_gives_one_view():
    def body(rank, size):
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        failed = _wait_failed([2])
        agreed = dist.agree(ALL & ~(1 << rank))
        return failed, agreed.value, agreed.failed
    results = run_ranks(body, 4, timeout=600, deadline=60, expect_errors=True)
    assert results[2][0] == "killed"
    assert [results[r] for r in (0, 1, 3)] == [([2], ALL & ~0b1011, [2])] * 3, results


@pytest.mark.parametrize("seed", range(3))
def test_agreements_stay_one_while_members_die(seed):
    rounds, victims = 30, (0, 3)  # rank 0: the first coordinator

    def body(rank, size):
        rng = random.Random(seed * 100 + rank)
        if rank in victims:
            threading.Timer(rng.uniform(0, 0.05), os.kill, (os.getpid(), signal.SIGKILL)).start()
        return [tuple(dist.agree(ALL & ~(1 << rank))) for _ in range(rounds)]
    results = run_ranks(body, 6, timeout=600, deadline=60, expect_errors=True)
    survivors = [r for r in range(6) if r not in victims]
    decisions = {tuple((v, tuple(f)) for v, f in results[r]) for r in survivors if results[r][0] != "killed"}
    assert len(decisions) == 1, decisions
    for value, failed in next(iter(decisions)):
        assert all(not value & (1 << r) and r not in failed for r in survivors), (bin(value), failed)


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_revoke_gets_blocked_peers_out_and_shrink_makes_a_fresh_group(transport):
    def body(rank, size):
        x = np.full(5, rank + 1, np.int64)
        if rank == 0:  # another thread of rank 0 revokes the group while rank 0 itself is blocked in it
            threading.Timer(0.5, dist.default_group().revoke).start()
        if rank == 3:
            time.sleep(3)  # late: everyone else waits for it, until the revocation
        start = time.monotonic()
        try:
            dist.all_reduce(x)
            outcome = "returned"
        except dist.AllreduceError as exc:
            outcome = (type(exc).__name__, "revoked" in str(exc), time.monotonic() - start < 2.5)
        dist.shrink_group()  # no one failed: the same ranks, a fresh group
        y = np.full(5, rank + 1, np.int64)
        dist.all_reduce(y)
        return outcome, dist.get_world_size(), y.tolist()
    results = run_ranks(body, 4, timeout=600, deadline=60, env={"ALLREDUCE_TRANSPORT": transport,
                                                                "ALLREDUCE_ALGO": "ring"})
    assert [r[0] for r in results] == [("Revoked", True, True)] * 4, results
    assert all(r[1:] == (4, [10] * 5) for r in results), results


def test_shrink_group_names_whom_to_exclude_and_checks_them():
    def body(rank, size):
        errors = []
        for bad in ([], [0, 0], [4], list(range(4)), (1,)):
            try:
                dist.shrink_group(bad)
            except (TypeError, ValueError) as exc:
                errors.append(type(exc).__name__)
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        _wait_failed([3])
        dist.shrink_group([3])
        x = np.full(7, rank + 1, np.int64)
        dist.all_reduce(x)
        return errors, dist.get_rank(), dist.get_world_size(), x.tolist()
    results = run_ranks(body, 4, timeout=600, deadline=60, expect_errors=True)
    assert results[3][0] == "killed"
    assert results[:3] == [(["ValueError"] * 4 + ["TypeError"], r, 3, [6] * 7) for r in range(3)], results


def test_a_subgroup_shrinks_and_the_others_keep_theirs():
    def body(rank, size):
        g = dist.new_group([1, 2, 3])
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0:
            return _wait_failed([2]), None
        assert _wait_failed([1], g) == [1]  # rank 2 of the world is rank 1 of g
        shrunk = dist.shrink_group(group=g)
        x = np.full(3, rank + 1, np.int64)
        dist.all_reduce(x, group=shrunk)
        return (dist.get_rank(shrunk), dist.get_world_size(shrunk), shrunk.ranks, x.tolist()), dist.get_rank()
    results = run_ranks(body, 4, timeout=600, deadline=60, expect_errors=True)
    assert results[0] == ([2], None)
    assert results[1] == ((0, 2, [1, 3], [6] * 3), 1)
    assert results[3] == ((1, 2, [1, 3], [6] * 3), 3)


@pytest.mark.parametrize("victim", [0, 1])
def test_two_hosts_shrink_across_shared_memory_and_tcp(victim):
    def body(rank, size):
        x = np.full(1000, rank + 1, np.int64)
        dist.all_reduce(x)
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            for _ in range(50):
                dist.all_reduce(x)
        except dist.AllreduceError:
            pass
        dist.shrink_group()
        topo = dist.get_topology()
        y = np.full(1000, rank + 1, np.int64)
        dist.all_reduce(y)
        return dist.get_world_size(), topo.hosts, int(y[0])
    results = run_ranks(on_hosts(2, body), 4, init=False, deadline=60, expect_errors=True)
    alive = [r for r in range(4) if r != victim]
    hosts = ((0,), (1, 2)) if victim in (0, 1) else None
    assert all(results[r] == (3, hosts, sum(a + 1 for a in alive)) for r in alive), results


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.02])
def test_a_member_dying_while_the_shrunk_group_forms_is_left_out_too(transport, delay):
    def body(rank, size):
        from allreduce.resilience import shrink

        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 2:  # agrees, then dies while the group of 0, 1, 2 forms (or just after)
            real = shrink.form_group

            def dying(store, *args, **kwargs):
                threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
                return real(store, *args, **kwargs)
            shrink.form_group = dying
        _wait_failed([3])
        start = time.monotonic()
        while True:  # the loop a user writes: shrink until a step succeeds
            dist.shrink_group()
            x = np.full(9, rank + 1, np.int64)
            try:
                dist.all_reduce(x)
            except dist.AllreduceError:
                continue
            if dist.get_world_size() == 2:
                return x.tolist(), time.monotonic() - start < 10
    results = run_ranks(body, 4, timeout=600, deadline=60, expect_errors=True, env={"ALLREDUCE_TRANSPORT": transport})
    assert results[2][0] == results[3][0] == "killed", results
    assert results[:2] == [([3] * 9, True)] * 2, results


def test_the_new_store_host_dying_before_the_others_reach_it_costs_no_wait_for_it():
    # Rank 0 (the store's host) dies; rank 1, the shrink's coordinator, hosts the new store and dies
    # right after it decided. The others, reaching a store whose host they know dead, try again at once
    # (with a reach allowance of 60 s here, a wait for it would show).
    def body(rank, size):
        from allreduce.resilience import shrink

        shrink.REACH_S = 60.0
        if rank == 1:
            shrink._reach = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(np.ones(4))
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        _wait_failed([0])
        start = time.monotonic()
        dist.shrink_group()
        x = np.full(7, rank + 1, np.int64)
        dist.all_reduce(x)
        return dist.get_world_size(), x.tolist(), time.monotonic() - start < 30
    results = run_ranks(body, 4, timeout=600, deadline=120, expect_errors=True)
    assert results[0][0] == results[1][0] == "killed", results
    assert results[2:] == [(2, [7] * 7, True)] * 2, results
