"""The backend as torch composes it: a ProcessGroup torch builds (name, device dispatch) around our
Backend, which answers every call torch makes, from Python and from C++, with Gloo's semantics."""

from __future__ import annotations

import datetime
import re
import time

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from support.torch_harness import run_torch_ranks

from allreduce import CommTimeout
from allreduce.torch.c10d.backend import ProcessGroupAllreduce

SECOND = datetime.timedelta(seconds=1)


def test_torch_builds_the_group_and_dispatches_cpu_to_our_backend():
    def fn(rank, size):
        world, sub = dist.group.WORLD, dist.new_group([0, 1])
        backend = world._get_backend(torch.device("cpu"))
        t = torch.ones(2)
        works = {"python": backend.allreduce([t]), "impl without opts": backend.impl.allreduce([t]),
                 "barrier": world.barrier(), "broadcast": world.broadcast([t])}
        futures = {name: w.get_future().wait() for name, w in works.items()}
        named = (world.group_name, sub.group_name, world.group_desc, dist.get_backend(sub), backend.name())
        dist.destroy_process_group(sub)
        return isinstance(backend.impl, ProcessGroupAllreduce), named, t.tolist(), sorted(futures)

    for is_ours, (world_name, sub_name, _desc, sub_backend, name), t, futures in run_torch_ranks(fn, 2):
        assert is_ours and world_name != sub_name and sub_backend == name == "allreduce"
        assert t == [4.0, 4.0]  # two all-reduces of ones on two ranks, the broadcast leaves it
        assert futures == ["barrier", "broadcast", "impl without opts", "python"]


def test_coalescing_with_and_without_a_device():
    def fn(rank, size):
        a, b = torch.full((2,), rank + 1.0), torch.full((3,), 10.0 * (rank + 1))
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        cm.wait()
        c, d = torch.ones(1), torch.full((2,), 2.0)
        with dist._coalescing_manager():  # torch's fast path: one allreduce_coalesced
            dist.all_reduce(c)
            dist.all_reduce(d)
        out = torch.empty(2 * size)
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
        cm.wait()
        return [x.tolist() for x in (a, b, c, d, out)]

    for got in run_torch_ranks(fn, 2):
        assert got == [[3.0] * 2, [30.0] * 3, [2.0], [4.0, 4.0], [0.0, 0.0, 1.0, 1.0]]


def test_a_blocking_call_returns_a_finished_work_and_an_async_one_finishes_on_wait():
    def fn(rank, size):
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        blocking = dist.AllreduceOptions()
        blocking.asyncOp = False  # what dist.all_reduce(t) passes
        t = torch.full((3,), rank + 1.0)
        work = backend.allreduce([t], blocking)
        at_once = (work.is_completed(), t.tolist())  # before any wait: it ran in this thread
        value = work.get_future().wait()[0].tolist()
        strided = torch.arange(6.0).reshape(2, 3).t() * (rank + 1)  # not contiguous: staged, copied back
        dist.all_reduce(strided, op=dist.ReduceOp.MAX)
        pending = dist.all_reduce(u := torch.full((2,), 10.0 * rank), async_op=True)
        pending.wait()
        return at_once, value, strided.tolist(), u.tolist()

    for at_once, value, strided, u in run_torch_ranks(fn, 2):
        assert at_once == (True, [3.0] * 3) and value == [3.0] * 3
        assert strided == (torch.arange(6.0).reshape(2, 3).t() * 2).tolist()
        assert u == [10.0, 10.0]


def test_a_receive_reports_its_source():
    def fn(rank, size):
        t = torch.full((2,), float(rank))
        if rank == 0:
            dist.send(t + 5, dst=1)
            return None
        work = dist.irecv(t, src=0)
        work.wait()
        return work._source_rank(), t.tolist()

    assert run_torch_ranks(fn, 2)[1] == (0, [5.0, 5.0])


def test_a_receive_from_any_source_reports_the_sender_in_global_ranks():
    def fn(rank, size):
        sub = dist.new_group([0, 2])  # group rank 1 is global rank 2
        if rank:
            dist.send(torch.full((3,), 10.0 * rank), dst=0, tag=7)
            if rank == 2:
                dist.send(torch.full((3,), 99.0), dst=0, group=sub)
            return None
        t, u, v = torch.zeros(3), torch.zeros(3), torch.zeros(3)
        first = dist.recv(t, tag=7)
        work = dist.irecv(u, tag=7)
        work.wait()
        from_sub = dist.recv(v, group=sub)
        return sorted([(first, t.tolist()), (work._source_rank(), u.tolist())]), (from_sub, v.tolist())

    senders, from_sub = run_torch_ranks(fn, 3)[0]
    assert senders == [(1, [10.0] * 3), (2, [20.0] * 3)]
    assert from_sub == (2, [99.0] * 3)


def test_sparse_all_reduce_sums_like_gloo():
    def fn(rank, size):
        gloo = dist.new_group(backend="gloo")
        out = {}
        for name, group in (("allreduce", None), ("gloo", gloo)):
            t = torch.sparse_coo_tensor([[rank, 2], [0, 1]], [rank + 1.0, 5.0], (3, 2))
            dist.all_reduce(t, group=group)
            out[name] = (t.is_sparse, t.to_dense().tolist())
        with pytest.raises(ValueError, match="SUM only"):
            dist.all_reduce(torch.sparse_coo_tensor([[0]], [1.0], (2,)), op=dist.ReduceOp.MAX)
        return out

    for out in run_torch_ranks(fn, 2):
        assert out["allreduce"] == out["gloo"] == (True, [[1.0, 0.0], [2.0, 0.0], [0.0, 10.0]])


def test_a_timeout_says_timed_out_the_way_torchs_callers_match():
    def fn(rank, size):
        short = dist.new_group(timeout=SECOND)
        if rank == 0:
            with pytest.raises(CommTimeout) as caught:
                dist.barrier(group=short)
            message = str(caught.value)
        else:
            time.sleep(2.5)  # never enters the barrier
            message = ""
        dist.destroy_process_group(short)
        return message

    message = run_torch_ranks(fn, 2)[0]
    assert re.search(" (Timed out|closed|timeout) ", message), message  # torch's _test_barrier_timeout
    assert "barrier #1" in message and "rank 0/2" in message and "rank 1" in message.split("#1", 1)[1]


def test_monitored_barrier_names_the_ranks_that_did_not_arrive():
    def fn(rank, size):
        world = dist.group.WORLD
        world.monitored_barrier(SECOND)  # everyone arrives
        if rank == 0:
            with pytest.raises(RuntimeError, match=r"\[Rank 0\]: Ranks 1, 2 failed to pass monitoredBarrier in 300 ms"):
                world.monitored_barrier(datetime.timedelta(milliseconds=300), wait_all_ranks=True)
            with pytest.raises(RuntimeError, match=r"\[Rank 0\]: Rank 1 failed to pass monitoredBarrier in 300 ms"):
                world.monitored_barrier(datetime.timedelta(milliseconds=300))
        with pytest.raises(ValueError, match="only implemented for GLOO"):  # torch's own API is Gloo's alone
            dist.monitored_barrier()
        dist.barrier()
        return True

    assert run_torch_ranks(fn, 3) == [True] * 3


def test_destroying_a_group_releases_our_keys_from_torchs_store():
    """Groups made and destroyed in a loop leave at most torch's own key per group in its store (ours:
    addresses, hellos, progress, point-to-point ports, were seven more per group)."""
    def fn(rank, size):
        store = dist.distributed_c10d._get_default_store()
        counts = []
        for cycle in range(21):
            group = dist.new_group([0, 1])
            dist.all_reduce(torch.ones(1), group=group)
            dist.destroy_process_group(group)
            dist.barrier()
            if cycle % 10 == 0:
                counts.append(store.num_keys())
        return counts

    for first, middle, last in run_torch_ranks(fn, 2):
        # torch's one key per group, and now and then one of ours on a loaded machine (releasing is best
        # effort: a goodbye past its grace leaves its key); a leak per group would add seven each time
        assert last - middle <= 15 and middle - first <= 15, (first, middle, last)
