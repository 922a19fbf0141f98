"""The torch.distributed backend "allreduce": torch's private hooks, every dist.* collective, DDP."""

from __future__ import annotations

import concurrent.futures
import datetime
import functools
import importlib
import os

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from support.harness import run_ranks
from support.torch_harness import batches, max_difference, model, run_spawned, run_torch_ranks, shard, weights

import allreduce.torch as art
from allreduce import CommTimeout, Mismatch, Work
from allreduce.torch.c10d import native, private
from allreduce.torch.c10d.torchstore import TorchStore
from allreduce.torch.c10d.work import TorchWork


def test_the_installed_torch_still_has_the_private_hooks_the_backend_uses():
    """Fails (not skips) when a torch upgrade removes or renames what the backend relies on."""
    assert private.missing() == [], f"torch {torch.__version__} lacks what the allreduce backend uses"
    assert issubclass(native.python_backend(os.environ), importlib.import_module("torch._C._distributed_c10d").Backend)
    assert "allreduce" in dist.Backend.backend_list


def test_a_missing_hook_is_named(monkeypatch):
    monkeypatch.setitem(private.TORCH_HOOKS, "ProcessGroup", ["_get_backend", "_a_hook_torch_dropped"])
    assert private.missing() == ["ProcessGroup._a_hook_torch_dropped"]


def test_works_complete_from_the_group_thread_and_carry_errors():
    done, failed = concurrent.futures.Future(), concurrent.futures.Future()
    ok = TorchWork([Work(done, "test")], [torch.ones(1)])
    bad = TorchWork([Work(failed, "test")], [torch.ones(1)])
    assert not ok.is_completed()
    with pytest.raises(TimeoutError):
        ok.wait(datetime.timedelta(milliseconds=10))
    done.set_result(None)
    failed.set_exception(Mismatch("rank 1 called broadcast"))
    assert ok.wait() and ok.is_success() and ok.get_future().wait()[0].item() == 1.0
    with pytest.raises(Mismatch, match="broadcast"):
        bad.wait()
    with pytest.raises(RuntimeError, match="broadcast"):  # what a C++ consumer such as DDP sees
        bad.get_future().wait()


def test_a_torch_store_answers_allreduce_store_requests():
    store = TorchStore(dist.PrefixStore("group/", dist.HashStore()), timeout=5.0)
    store.set("a", b"1")
    assert store.get("a") == b"1" and store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.check(["a"]) and not store.check(["a", "b"])
    store.wait(["a"], timeout=0)  # zero: a check, not torch's "wait forever"
    with pytest.raises(CommTimeout, match="'b'"):
        store.get("b", timeout=0.05)
    with pytest.raises(CommTimeout, match="'c'"):
        store.wait(["a", "c"], timeout=0.05)
    assert store.delete_key("a") and not store.check(["a"])
    assert store.prefix("sub").add("k", 1) == 1 and store.check(["sub/k"])


def collectives(rank, size):
    """Every dist.* collective once, on the default group of the allreduce backend."""
    out = {}
    x = torch.arange(4, dtype=torch.float32) + rank
    for op in ("SUM", "MAX", "MIN", "PRODUCT", "AVG"):
        t = x.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce {op}"] = t
    t = x.clone()
    work = dist.all_reduce(t, async_op=True)
    out["async all_reduce future"] = work.get_future().wait()[0]
    assert work.is_completed()
    half = torch.full((3,), 1.5, dtype=torch.bfloat16)
    dist.all_reduce(half)
    out["all_reduce bfloat16"] = half.float()
    strided = torch.arange(12.0).view(3, 4).t() * (rank + 1)  # not contiguous: staged and copied back
    dist.all_reduce(strided)
    out["all_reduce strided"] = strided
    t = x.clone()
    dist.reduce(t, dst=1)
    out["reduce"] = t
    t = x.clone()
    dist.broadcast(t, src=2)
    out["broadcast"] = t
    parts = [torch.empty(4) for _ in range(size)]
    dist.all_gather(parts, x)
    out["all_gather"] = torch.cat(parts)
    t = torch.empty(4 * size)
    dist.all_gather_into_tensor(t, x)
    out["all_gather_into_tensor"] = t
    t = torch.empty(2)
    dist.reduce_scatter(t, [torch.full((2,), float(rank * 10 + j)) for j in range(size)])
    out["reduce_scatter"] = t
    t = torch.empty(2)
    dist.reduce_scatter_tensor(t, torch.arange(2.0 * size) * (rank + 1))
    out["reduce_scatter_tensor"] = t
    t = torch.empty(size)
    dist.all_to_all_single(t, torch.arange(float(size)) + 10 * rank)
    out["all_to_all_single"] = t
    sends = [j + 1 for j in range(size)]  # rank r sends j+1 rows to rank j
    receives = [rank + 1] * size
    t = torch.empty(sum(receives), 2)
    dist.all_to_all_single(t, torch.full((sum(sends), 2), float(rank)), receives, sends)
    out["all_to_all_single uneven"] = t
    blocks = [torch.empty(rank + 1) for _ in range(size)]
    dist.all_to_all(blocks, [torch.full((j + 1,), float(rank)) for j in range(size)])
    out["all_to_all"] = torch.cat(blocks)
    gathered = [torch.empty(4) for _ in range(size)] if rank == 0 else None
    dist.gather(x, gathered, dst=0)
    out["gather"] = torch.cat(gathered) if rank == 0 else torch.empty(0)
    t = torch.empty(2)
    dist.scatter(t, [torch.full((2,), float(j)) for j in range(size)] if rank == 1 else None, src=1)
    out["scatter"] = t
    dist.barrier()
    t = torch.full((3,), float(rank))
    if rank == 0:
        dist.send(t, dst=1)
        dist.recv(t, src=size - 1)
    elif rank == 1:
        dist.recv(t, src=0)
        dist.send(t * 2, dst=size - 1 if size > 2 else 0)
    elif rank == size - 1:
        dist.recv(t, src=1)
        dist.send(t + 1, dst=0)
    out["send/recv"] = t
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    t = torch.empty(2)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(rank)), nxt),
                                    dist.P2POp(dist.irecv, t, prev)])
    for w in works:
        w.wait()
    out["batch_isend_irecv"] = t
    objects = [{"rank": rank}]
    dist.broadcast_object_list(objects, src=2)
    gathered = [None] * size
    dist.all_gather_object(gathered, ("r", rank))
    sub = dist.new_group([0, 2])
    t = torch.full((2,), float(rank))
    if rank in (0, 2):
        dist.all_reduce(t, group=sub)
    out["subgroup all_reduce"] = t
    return {k: v.numpy().copy() for k, v in out.items()}, objects[0], gathered


def expected(rank, size):
    x = lambda r: np.arange(4, dtype=np.float32) + r  # noqa: E731
    ranks = range(size)
    strided = np.arange(12.0).reshape(3, 4).T * sum(r + 1 for r in ranks)
    return {
        "all_reduce SUM": sum(x(r) for r in ranks), "all_reduce MAX": x(size - 1), "all_reduce MIN": x(0),
        "all_reduce PRODUCT": np.prod([x(r) for r in ranks], axis=0), "all_reduce AVG": sum(x(r) for r in ranks) / size,
        "async all_reduce future": sum(x(r) for r in ranks), "all_reduce bfloat16": np.full(3, 1.5 * size),
        "all_reduce strided": strided,
        "reduce": sum(x(r) for r in ranks) if rank == 1 else x(rank), "broadcast": x(2),
        "all_gather": np.concatenate([x(r) for r in ranks]),
        "all_gather_into_tensor": np.concatenate([x(r) for r in ranks]),
        "reduce_scatter": np.full(2, float(sum(r * 10 + rank for r in ranks))),
        "reduce_scatter_tensor": np.arange(2.0 * size)[2 * rank:2 * rank + 2] * sum(r + 1 for r in ranks),
        "all_to_all_single": np.array([rank + 10.0 * r for r in ranks]),
        "all_to_all_single uneven": np.concatenate([np.full((rank + 1, 2), float(r)) for r in ranks]),
        "all_to_all": np.concatenate([np.full(rank + 1, float(r)) for r in ranks]),
        "gather": np.concatenate([x(r) for r in ranks]) if rank == 0 else np.empty(0),
        "scatter": np.full(2, float(rank)),
        "send/recv": {0: np.full(3, 1.0), 1: np.full(3, 0.0), size - 1: np.full(3, 0.0)}[rank],
        "batch_isend_irecv": np.full(2, float((rank - 1) % size)),
        "subgroup all_reduce": np.full(2, 2.0) if rank in (0, 2) else np.full(2, float(rank)),
    }


def test_every_collective_through_the_backend():
    size = 3
    for rank, (got, obj, gathered) in enumerate(run_torch_ranks(collectives, size)):
        want = expected(rank, size)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=f"rank {rank}: {name}")
        assert obj == {"rank": 2} and gathered == [("r", r) for r in range(size)]


def test_errors_reach_synchronous_calls():
    def fn(rank, size):
        with pytest.raises(Mismatch, match="count"):
            dist.all_reduce(torch.ones(3 + rank))  # the ranks disagree on the size
        return True

    assert run_torch_ranks(fn, 2) == [True, True]


def test_unsupported_ops_are_refused():
    def fn(rank, size):
        with pytest.raises(ValueError, match="PREMUL_SUM"):
            dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))
        return True

    assert run_torch_ranks(fn, 2) == [True, True]


def test_ddp_on_allreduce_matches_ddp_on_gloo():
    data = batches(50, 48)

    def fn(rank, size):
        gloo = dist.new_group(backend="gloo")
        runs = {}
        for name, group, hook in (("allreduce", None, None), ("gloo", gloo, None),
                                  ("allreduce+hook", None, default_hooks.allreduce_hook)):
            ddp = torch.nn.parallel.DistributedDataParallel(model(seed=rank), process_group=group, bucket_cap_mb=0.001)
            if hook is not None:
                ddp.register_comm_hook(None, hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
            for batch in data:
                x, y = shard(batch, rank, size)
                opt.zero_grad()
                torch.nn.CrossEntropyLoss()(ddp(x), y).backward()
                opt.step()
            runs[name] = weights(ddp.module)
        return runs

    results = run_torch_ranks(fn, 3)
    for runs in results:
        assert max_difference(runs["allreduce"], runs["gloo"]) <= 1e-5
        assert max_difference(runs["allreduce+hook"], runs["allreduce"]) <= 1e-5
        assert max_difference(runs["allreduce"], results[0]["allreduce"]) == 0.0


def test_distributed_optimizer_on_a_torch_initialized_group():
    data = batches(5, 32)

    def fn(rank, size):
        m = model()
        opt = art.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression=art.Compression.fp16)
        for batch in data:
            x, y = shard(batch, rank, size)
            opt.zero_grad()
            torch.nn.CrossEntropyLoss()(m(x), y).backward()
            opt.step()
        return weights(m)

    first, second = run_torch_ranks(fn, 2)
    assert max_difference(first, second) == 0.0


def train_on(rank, size, device):
    """DDP, DistributedOptimizer and ZeRO on ``device`` for a few steps (module level: runs spawned)."""
    dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if device == "cuda" else "cpu")
    t = torch.full((5,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    out = {"all_reduce": {"t": t.cpu().numpy()}}
    ddp = torch.nn.parallel.DistributedDataParallel(model().to(dev))
    opts = {"ddp": (ddp.module, torch.optim.SGD(ddp.parameters(), lr=0.1), ddp)}
    m = model().to(dev)
    opts["optimizer"] = (m, art.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                                     compression=art.Compression.fp16), m)
    m = model().to(dev)
    opts["zero"] = (m, art.ZeroRedundancyOptimizer(m.parameters(), torch.optim.Adam, stage=2, lr=0.01), m)
    for name, (module, opt, forward) in opts.items():
        for batch in batches(3, 16):
            x, y = (v.to(dev) for v in shard(batch, rank, size))
            opt.zero_grad()
            torch.nn.CrossEntropyLoss()(forward(x), y).backward()
            opt.step()
        out[name] = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_training_in_spawned_ranks(device):
    """Spawned ranks, as torchrun starts them; on CUDA the tensors are staged through pinned memory."""
    first, second = run_spawned(functools.partial(train_on, device=device), 2)
    np.testing.assert_array_equal(first["all_reduce"]["t"], np.full(5, 3.0))
    for name in ("ddp", "optimizer", "zero"):
        assert max_difference(first[name], second[name]) == 0.0, name
        assert all(np.isfinite(v).all() for v in first[name].values())


def test_coalesced_calls_refuse_mixed_dtypes():
    def fn(rank, size):
        with pytest.raises(TypeError, match="share a dtype"):  # refused as Gloo does: a cat would convert
            with dist._coalescing_manager():  # torch hands the backend's allreduce_coalesced both tensors
                dist.all_reduce(torch.ones(2))
                dist.all_reduce(torch.full((2,), 2**24 + 1, dtype=torch.int64))
        same = [torch.full((2,), rank + 1.0), torch.full((3,), 2.0 * rank)]
        with dist._coalescing_manager():
            for t in same:
                dist.all_reduce(t)
        return [t.tolist() for t in same]

    assert run_torch_ranks(fn, 2) == [[[3.0, 3.0], [2.0, 2.0, 2.0]]] * 2


def test_torch_ops_keep_their_names_on_allreduce_calls():
    def fn(rank, size):
        import allreduce

        got = {}
        for name in ("MIN", "MAX", "PRODUCT", "AVG", "SUM"):
            t = torch.tensor([rank + 2.0, 4.0 - rank])
            allreduce.all_reduce(t, op=getattr(dist.ReduceOp, name))
            got[name] = t.tolist()
        ints = torch.tensor([rank + 2, 4 - rank])
        allreduce.all_reduce(ints, op=dist.ReduceOp.MAX)
        got["MAX int"] = ints.tolist()
        with pytest.raises(TypeError, match="AVG"):
            allreduce.all_reduce(ints, op=dist.ReduceOp.AVG)
        return got

    want = {"MIN": [2.0, 3.0], "MAX": [3.0, 4.0], "PRODUCT": [6.0, 12.0], "AVG": [2.5, 3.5], "SUM": [5.0, 7.0],
            "MAX int": [3, 4]}
    assert run_ranks(fn, 2) == [want, want]
