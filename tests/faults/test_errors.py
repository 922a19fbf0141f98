"""Nothing hangs and nothing is silently wrong: dead peers, absent peers, mismatches, bad arguments."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from support import engines
from support.harness import free_port, run_ranks
from support.scenarios import killed_mid_collective, mismatched

import allreduce as dist

pytestmark = engines.BOTH  # the lines run in Python and in C


@pytest.fixture
def solo():
    """A one-rank world in this process, for argument checks that fail before anything is sent."""
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=10)
    yield
    dist.destroy_process_group()


def test_bad_arguments_raise_before_sending(solo):
    with pytest.raises(ValueError, match="C-contiguous"):
        dist.all_reduce(np.zeros((4, 4))[:, 1])
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dist.all_reduce(frozen)
    with pytest.raises(TypeError, match="BAND is not defined for dtype float32"):
        dist.all_reduce(np.zeros(4, np.float32), op=dist.ReduceOp.BAND)
    with pytest.raises(TypeError, match="AVG is not defined for dtype int32"):
        dist.all_reduce(np.zeros(4, np.int32), op=dist.ReduceOp.AVG)
    with pytest.raises(TypeError, match="not supported"):
        dist.all_reduce(np.zeros(4, dtype=">f4"))
    with pytest.raises(TypeError, match="numpy array"):
        dist.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="src=3 is not a rank"):
        dist.broadcast(np.zeros(4), src=3)
    with pytest.raises(ValueError, match="world size x input"):
        dist.all_gather_into_tensor(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="world size x output"):
        dist.reduce_scatter_tensor(np.zeros(2), np.zeros(3))
    with pytest.raises(TypeError, match="dtypes differ"):
        dist.all_gather_into_tensor(np.zeros(2, np.float32), np.zeros(2, np.float64))
    with pytest.raises(ValueError, match="unknown all_reduce algorithm 'nope'; known: ring"):
        dist.all_reduce(np.zeros(4), algorithm="nope")
    with pytest.raises(TypeError, match="takes a number"):
        dist.all_reduce_scalar("three")
    # the group is still usable after refused calls
    x = np.arange(5.0)
    dist.all_reduce(x)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_not_initialized_and_double_init():
    with pytest.raises(RuntimeError, match="not initialized"):
        dist.all_reduce(np.zeros(1))
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="already called"):
            dist.init_process_group(init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", [2, 4])
def test_dead_peer_fails_every_rank_within_two_seconds(size):
    results = run_ranks(killed_mid_collective, size, timeout=60, expect_errors=True)
    assert results[1] == ("killed", -signal.SIGKILL)
    for rank, outcome in enumerate(results):
        if rank == 1:
            continue
        assert outcome is not None, f"rank {rank} never noticed the dead peer"
        elapsed, kind, message = outcome
        assert elapsed < 2.0, outcome
        assert kind in ("PeerLost", "GroupBroken"), outcome
        assert f"rank {rank}/{size}" in message and "all_reduce #" in message, message


def _one_rank_never_calls(rank, size):
    if rank == size - 1:
        time.sleep(4)  # stuck in "compute"
        return None
    x = np.ones(10, np.float32)
    try:
        dist.all_reduce(x, algorithm="ring")
    except (dist.CommTimeout, dist.PeerLost) as exc:
        return str(exc)
    return "no error"


def test_absent_peer_times_out_with_stall_report():
    results = run_ranks(_one_rank_never_calls, 3, timeout=1.5, expect_errors=True)
    # the first rank to time out names the absent rank and aborts; the other hears its reason
    for message in results[:2]:
        assert "all_reduce #1 (ring, step " in message, message
        assert "timed out after 1.5s waiting for rank" in message, message
        assert "ranks that have not reached all_reduce #1: 2 (no collective yet)" in message, message


@pytest.mark.parametrize("kind,words", [("count", "count"), ("dtype", "dtype"), ("op", "op"),
                                        ("order", "broadcast")])
def test_mismatch_is_an_error_on_every_rank(kind, words):
    results = run_ranks(mismatched(kind), 2, timeout=20, expect_errors=True)
    for kind_name, message in results:
        assert kind_name in ("Mismatch", "PeerLost"), (kind_name, message)
        assert words in message, message


def test_outside_group_is_an_error():
    def body(rank, size):
        group = dist.new_group([0, 1])
        if rank == 2:
            with pytest.raises(ValueError, match="not a member of group \\[0, 1\\]"):
                dist.all_reduce(np.ones(3), group=group)
            return dist.get_rank(group)
        x = np.full(3, rank + 1.0)
        dist.all_reduce(x, group=group)
        return x.tolist(), dist.get_rank(group)
    results = run_ranks(body, 3)
    assert results == [([3.0] * 3, 0), ([3.0] * 3, 1), -1]


def test_group_is_unusable_after_failure():
    def body(rank, size):
        if rank == 1:
            os._exit(3)
        try:
            dist.all_reduce(np.ones(3))
        except dist.PeerLost:
            pass
        with pytest.raises(dist.GroupBroken, match="earlier failure"):
            dist.all_reduce(np.ones(3))
        return "ok"
    results = run_ranks(body, 2, expect_errors=True)
    assert results[0] == "ok"
