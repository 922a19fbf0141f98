"""The shared-memory transport: the collective matrix over it, each way a payload travels (inline
slots, cross-memory reads, registered buffers), errors (mismatch, dead peer), cheap waiting, and no
segment left behind after a normal exit, an exception or SIGKILL."""

from __future__ import annotations

import gc
import os
import signal
import time

import numpy as np
import pytest
from support.harness import free_port, run_ranks
from support.reference import counts_for, make_input, reduced, same
from support.matrices import all_reduce_matrix, block_matrix, rooted_matrix
from support.scenarios import killed_mid_collective, mismatched

import allreduce as dist
from allreduce import algorithms
from allreduce.transport import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64")

SHM = {"ALLREDUCE_TRANSPORT": "shm"}
NO_CMA = {**SHM, "ALLREDUCE_SHM_CROSS_MEMORY": "0"}


def _our_memory() -> list[str]:
    """This process's mappings and descriptors of allreduce memfd segments."""
    with open("/proc/self/maps") as f:
        maps = [line.split()[-2] for line in f if "memfd:allreduce" in line]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "memfd:allreduce" in target:
            fds.append(target)
    return maps + fds


def _dev_shm() -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith("allreduce")]  # our names (memfd)


# ---- correctness -------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 3])
def test_all_reduce_matrix(size):
    assert run_ranks(all_reduce_matrix, size, env=SHM, deadline=240) == [[]] * size


def _crowded(rank, size):
    """Every all-reduce algorithm and the block collectives, on a few dtypes: 8 ranks share 2 cores."""
    wrong = []
    for dtype in (np.float32, np.int64, np.uint8):
        for count in counts_for(size):
            inputs = [make_input(dtype, count, r) for r in range(size)]
            for algo in algorithms.names("all_reduce"):
                x = inputs[rank].copy()
                dist.all_reduce(x, algorithm=algo)
                if not same(x, reduced(dist.ReduceOp.SUM, inputs)):
                    wrong.append(f"all_reduce {algo} {np.dtype(dtype)} count={count}")
            gathered = np.empty(size * count, dtype)
            dist.all_gather_into_tensor(gathered, inputs[rank], algorithm="direct")
            if not same(gathered, np.concatenate(inputs)):
                wrong.append(f"all_gather {np.dtype(dtype)} count={count}")
    return wrong


def test_more_ranks_than_cores():
    assert run_ranks(_crowded, 8, env=SHM, deadline=240) == [[]] * 8


@pytest.mark.parametrize("size", [2, 4])
def test_rooted_andblock_matrix(size):
    def both(rank, size):
        return rooted_matrix(rank, size) + block_matrix(rank, size)
    assert run_ranks(both, size, env=SHM, deadline=240) == [[]] * size


def _large(rank, size):
    """Payloads of several chunks, uneven sizes and dtypes, through every all-reduce-like algorithm."""
    wrong = []
    for dtype, count in ((np.float32, (1 << 20) + 3), (np.int8, 300_001), (np.float64, 40_000)):
        inputs = [make_input(dtype, count, r) for r in range(size)]
        for algo in ("direct", "ring", "hierarchical"):
            x = inputs[rank].copy()
            dist.all_reduce(x, algorithm=algo)
            if not same(x, reduced(dist.ReduceOp.SUM, inputs)):
                wrong.append(f"all_reduce {algo} {np.dtype(dtype)} {count}")
        block = count // size
        out = np.empty(block, dtype)
        dist.reduce_scatter_tensor(out, inputs[rank][:block * size], algorithm="direct")
        whole = reduced(dist.ReduceOp.SUM, [i[:block * size] for i in inputs])
        if not same(out, whole[rank * block:(rank + 1) * block]):
            wrong.append(f"reduce_scatter direct {np.dtype(dtype)}")
        gathered = np.empty(size * count, dtype)
        dist.all_gather_into_tensor(gathered, inputs[rank], algorithm="direct")
        if not same(gathered, np.concatenate(inputs)):
            wrong.append(f"all_gather direct {np.dtype(dtype)}")
        x = inputs[rank].copy()
        dist.broadcast(x, src=size - 1)
        if not same(x, inputs[size - 1]):
            wrong.append(f"broadcast {np.dtype(dtype)}")
    return wrong


@pytest.mark.parametrize("env", [SHM, NO_CMA], ids=["cross-memory", "inline"])
def test_large_payloads(env):
    assert run_ranks(_large, 3, env=env, deadline=120) == [[]] * 3


def _registered(rank, size):
    count = (1 << 20) + 5
    inputs = [make_input(np.float32, count, r) for r in range(size)]
    ok, mapped = True, 0
    for _round in range(3):  # new buffers each round: peers map each, and unmap it once it is freed
        x = dist.empty(count, np.float32)
        x[:] = inputs[rank]
        dist.all_reduce(x, algorithm="direct")
        ok = ok and same(x, reduced(dist.ReduceOp.SUM, inputs))
        dist.barrier()
        mapped = max(mapped, sum("memfd:allreduce-buffer" in m for m in _our_memory()))
        del x
        gc.collect()
    for _ in range(2):  # the first tells the peers, the second has them act on it
        dist.all_reduce(np.ones(4, np.float32), algorithm="direct")
    dist.barrier()
    return ok, mapped, sum("memfd:allreduce-buffer" in m for m in _our_memory())


def test_registered_buffers_are_read_in_place():
    for ok, mapped, left in run_ranks(_registered, 3, env=SHM):
        assert ok
        assert mapped >= 3  # our own buffer and a mapping of each peer's
        assert left == 0  # freed buffers are unmapped everywhere


def test_empty_is_an_ordinary_array():
    x = dist.empty((3, 4), np.int16)
    assert x.shape == (3, 4) and x.dtype == np.int16 and x.flags.c_contiguous and x.flags.writeable
    x[:] = 7
    assert int(x.sum()) == 84
    with pytest.raises(ValueError, match="negative"):
        dist.empty((2, -1))


def _swap(rank, size):
    """Both ranks isend then irecv: sends must not wait for their receive, which is queued behind them."""
    ok = []
    for nbytes in (1 << 10, 1 << 20, 8 << 20):
        mine = make_input(np.int32, nbytes // 4, rank)
        theirs = np.empty_like(mine)
        sent, got = dist.isend(mine, 1 - rank), dist.irecv(theirs, 1 - rank)
        sent.wait()
        got.wait()
        ok.append(same(theirs, make_input(np.int32, nbytes // 4, 1 - rank)))
    return ok


def test_point_to_point_sends_do_not_wait_for_the_receiver():
    assert run_ranks(_swap, 2, env=SHM, timeout=10) == [[True] * 3] * 2


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,words", [("count", "count"), ("dtype", "dtype"), ("order", "broadcast")])
def test_mismatch_is_caught(kind, words):
    for kind_name, message in run_ranks(mismatched(kind), 2, timeout=20, env=SHM, expect_errors=True):
        assert kind_name in ("Mismatch", "PeerLost"), (kind_name, message)
        assert words in message, message


def test_dead_peer_is_noticed_within_two_seconds():
    results = run_ranks(killed_mid_collective, 3, timeout=60, env=SHM, expect_errors=True)
    assert results[1] == ("killed", -signal.SIGKILL)
    for rank in (0, 2):
        elapsed, kind, message = results[rank]
        assert elapsed < 2.0 and kind in ("PeerLost", "GroupBroken"), results[rank]
        assert f"rank {rank}/3" in message, message


def _late(rank, size):
    x = np.ones(4, np.float32)
    dist.all_reduce(x)
    if rank == 1:
        time.sleep(1.0)
    cpu = time.process_time()
    dist.all_reduce(x)
    return time.process_time() - cpu


def test_waiting_does_not_burn_a_core():
    waited, _ = run_ranks(_late, 2, env=SHM)
    assert waited < 0.3, f"rank 0 used {waited:.2f} s of CPU waiting 1 s for rank 1"


def _timeout_names_the_peer(rank, size):
    if rank == 1:
        time.sleep(2.5)
        return None
    try:
        dist.all_reduce(np.ones(4, np.float32), algorithm="direct")
    except dist.CommTimeout as exc:
        return str(exc)
    return "no error"


def test_timeout_names_the_absent_peer():
    message = run_ranks(_timeout_names_the_peer, 2, timeout=1.0, env=SHM, expect_errors=True)[0]
    assert "timed out after 1s waiting for rank 1" in message, message


def test_ranks_must_agree_on_the_channel_layout():
    port = free_port()

    def body(rank, size):
        os.environ["ALLREDUCE_SHM_CHUNK"] = str(65536 * (rank + 1))
        try:
            dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=5)
        except dist.RendezvousError as exc:
            return str(exc)
        dist.destroy_process_group()
        return "joined"

    for message in run_ranks(body, 2, init=False, env=SHM, expect_errors=True):
        assert "ALLREDUCE_SHM_" in str(message), message


# ---- nothing left behind -----------------------------------------------------------------------

def _normal(rank, size):
    x = np.ones(1 << 18, np.float32)
    dist.all_reduce(x)
    during = _our_memory()
    dist.destroy_process_group()
    return during, _our_memory()


def _exception(rank, size):
    x = np.ones(100, np.float32)
    dist.all_reduce(x)
    try:
        dist.all_reduce(np.ones(100 + rank, np.float32))
    except dist.AllreduceError:
        pass
    dist.destroy_process_group()
    return _our_memory()


def _killed(rank, size):
    x = np.ones(1 << 16, np.float32)
    dist.all_reduce(x)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(x)
    except dist.AllreduceError:
        pass
    dist.destroy_process_group()
    return _our_memory()


def test_nothing_left_after_normal_exit():
    assert not _dev_shm()
    for during, after in run_ranks(_normal, 3, env=SHM):
        assert any("allreduce-control" in m for m in during)
        assert after == []
    assert not _dev_shm()


def test_nothing_left_after_an_exception():
    assert run_ranks(_exception, 2, env=SHM, timeout=10) == [[], []]
    assert not _dev_shm()


def test_nothing_left_after_sigkill():
    results = run_ranks(_killed, 3, env=SHM, timeout=10, expect_errors=True)
    assert results[1] == ("killed", -signal.SIGKILL)
    assert results[0] == [] and results[2] == []
    assert not _dev_shm()
