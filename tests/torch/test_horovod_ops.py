"""``import allreduce.torch as hvd``: Horovod's collectives against references computed here.

Ranks contribute small integers in float32 (sums are exact, so results compare with ``==``) in shapes
that break naive code: 1001 elements over 3 ranks, dim 0 differing by rank with one rank holding no
rows, splits with zeros, a reduce-scatter of 7 rows over 3 ranks, integer averages that truncate (also
negative ones, toward zero as Horovod does), float16 averages whose sum overflows float16.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.hvd_harness import run_hvd
from support.torch_harness import run_ranks

import allreduce.torch as hvd

SIZE = 3


def contribution(rank: int, shape=(7, 11, 13)) -> torch.Tensor:
    """Rank ``rank``'s small-integer float32 tensor."""
    return torch.randint(-6, 7, shape, generator=torch.Generator().manual_seed(rank)).float()


def every(shape=(7, 11, 13)) -> torch.Tensor:
    return torch.stack([contribution(r, shape) for r in range(SIZE)])


def test_allreduce_family_matches_the_reference():
    def fn(rank, size):
        x = contribution(rank)
        out = {op: hvd.allreduce(x, op=op) for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product)}
        out["default"] = hvd.allreduce(x, name="x")
        out["average=False"] = hvd.allreduce(x, average=False)
        out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        out["fp16 wire"] = hvd.allreduce(x, compression=hvd.Compression.fp16)
        ints = [[1, 2, 1, -1, -2, -1], [2, 2, 2, -2, -2, -2], [2, 1, 1, -2, -2, -1]]
        out["int"] = hvd.allreduce(torch.tensor(ints[rank]))
        out["half"] = hvd.allreduce(torch.full((1001,), 40000.0, dtype=torch.float16))  # the sum overflows fp16
        y = x.clone()
        out["inplace"] = hvd.allreduce_(y, op=hvd.Sum)
        out["inplace is y"] = out["inplace"] is y
        handle = hvd.allreduce_async(x, op=hvd.Max)
        out["poll"] = hvd.poll(handle) in (True, False)
        out["async"] = hvd.synchronize(handle)
        out["again"] = hvd.synchronize(handle)
        z = x.clone()
        out["async_"] = hvd.synchronize(hvd.allreduce_async_(z, op=hvd.Sum)) is z and torch.equal(z, out[hvd.Sum])
        parts = [contribution(rank, (5,)), contribution(rank + 10, (3, 2))]
        out["grouped"] = hvd.grouped_allreduce(parts, op=hvd.Sum)
        out["grouped async"] = hvd.synchronize(hvd.grouped_allreduce_async(parts, op=hvd.Sum))
        copies = [p.clone() for p in parts]
        hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=hvd.Sum))
        out["grouped async_"] = copies
        out["grouped_"] = hvd.grouped_allreduce_([p.clone() for p in parts], op=hvd.Sum)
        w = x.clone().requires_grad_()
        (hvd.allreduce(w, op=hvd.Sum) * (rank + 1)).sum().backward()
        out["grad"] = w.grad
        with pytest.raises(ValueError, match="supersedes"):
            hvd.allreduce(x, average=True, op=hvd.Sum)
        with pytest.raises(TypeError, match="dtype"):
            hvd.grouped_allreduce([x, x.long()])
        return out

    results = run_hvd(fn, SIZE)
    everyone = every()
    parts = [torch.stack([contribution(r, (5,)) for r in range(SIZE)]).sum(0),
             torch.stack([contribution(r + 10, (3, 2)) for r in range(SIZE)]).sum(0)]
    total = everyone.sum(0)
    for out in results:
        assert torch.equal(out[hvd.Sum], total) and torch.equal(out["average=False"], total)
        assert torch.equal(out[hvd.Average], total / 3) and torch.equal(out["default"], out[hvd.Average])
        torch.testing.assert_close(out["fp16 wire"], total / 3, rtol=2**-10, atol=0)  # the mean travels in fp16
        assert torch.equal(out[hvd.Min], everyone.min(0).values) and torch.equal(out[hvd.Max], everyone.max(0).values)
        assert torch.equal(out[hvd.Product], everyone.prod(0))
        assert torch.equal(out["scaled"], (everyone * 0.5).sum(0) * 3.0)
        assert out["int"].tolist() == [1, 1, 1, -1, -2, -1]  # sums 5, 5, 4, -5, -6, -4 times 1/3, toward zero
        assert out["int"].dtype == torch.int64
        assert out["half"].dtype == torch.float16 and bool((out["half"] == 40000).all())
        assert torch.equal(out["inplace"], total) and out["inplace is y"]
        assert out["poll"] and torch.equal(out["async"], out[hvd.Max]) and out["again"] is None and out["async_"]
        for grouped in (out["grouped"], out["grouped async"], out["grouped async_"], out["grouped_"]):
            assert [g.shape for g in grouped] == [(5,), (3, 2)]
            assert all(torch.equal(g, p) for g, p in zip(grouped, parts))
        assert bool((out["grad"] == 1 + 2 + 3).all())  # the gradient of a sum is the sum of the gradients


def test_gathers_broadcasts_alltoall_and_reducescatter():
    rows = [2, 0, 3]
    splits = [[1, 0, 2], [0, 0, 0], [3, 1, 1]]  # splits[i][j]: rows rank i sends rank j

    def rows_of(rank):
        return torch.arange(rows[rank] * 4).view(rows[rank], 4) + 100 * rank

    def fn(rank, size):
        out = {"gather": hvd.allgather(rows_of(rank))}
        out["gather async"] = hvd.synchronize(hvd.allgather_async(rows_of(rank)))
        out["grouped gather"] = hvd.grouped_allgather([rows_of(rank), rows_of(rank).float()])
        with pytest.raises(RuntimeError, match="mismatched trailing shapes"):  # Horovod's type: RuntimeError
            hvd.allgather(torch.zeros(1, 2 + (rank == 1)))
        w = torch.ones(rows[rank], 4, requires_grad=True)
        (hvd.allgather(w) * torch.arange(5.0)[:, None] * (rank + 1)).sum().backward()
        out["gather grad"] = w.grad
        x = torch.full((3, 5), float(rank))
        out["bcast"], out["x kept"] = hvd.broadcast(x, root_rank=2), torch.equal(x, torch.full((3, 5), float(rank)))
        out["bcast async"] = hvd.synchronize(hvd.broadcast_async(x, root_rank=1))
        y = x.clone()
        out["bcast_"] = hvd.broadcast_(y, root_rank=0) is y and bool((y == 0).all())
        hvd.synchronize(hvd.broadcast_async_(y.fill_(rank), root_rank=2))
        out["bcast async_"] = y
        v = torch.ones(2, requires_grad=True)
        (hvd.broadcast(v, root_rank=1) * (rank + 1)).sum().backward()
        out["bcast grad"] = v.grad
        mine = torch.arange(sum(splits[rank]) * 2).view(-1, 2) + 100 * rank
        out["a2a"], out["a2a splits"] = hvd.alltoall(mine, splits=splits[rank])
        out["a2a even"] = hvd.alltoall(torch.arange(3) + 10 * rank)
        out["a2a async"] = hvd.synchronize(hvd.alltoall_async(mine, splits=torch.tensor(splits[rank])))[0]
        z = torch.ones(6, 2, requires_grad=True)
        (hvd.alltoall(z) * (rank + 1)).sum().backward()
        out["a2a grad"] = z.grad
        seven = torch.arange(14.0).view(7, 2) * (rank + 1)
        out["rs sum"] = hvd.reducescatter(seven, op=hvd.Sum)
        out["rs avg"] = hvd.synchronize(hvd.reducescatter_async(seven))
        out["rs grouped"] = hvd.grouped_reducescatter([seven, seven[:4]], op=hvd.Sum)
        out["objects"] = hvd.allgather_object({"rank": rank}), hvd.broadcast_object(f"from {rank}", root_rank=1)
        hvd.barrier()
        return out

    results = run_hvd(fn, SIZE)
    gathered = torch.cat([rows_of(r) for r in range(SIZE)])
    seven = torch.arange(14.0).view(7, 2) * 6
    for rank, out in enumerate(results):
        assert torch.equal(out["gather"], gathered) and torch.equal(out["gather async"], gathered)
        assert torch.equal(out["grouped gather"][1], gathered.float())
        start = sum(rows[:rank])
        expected = torch.arange(5.0)[start:start + rows[rank], None].expand(-1, 4) * 2  # averaged (rank+1): 2
        assert torch.equal(out["gather grad"], expected)
        assert bool((out["bcast"] == 2).all()) and out["x kept"] and bool((out["bcast async"] == 1).all())
        assert out["bcast_"] and bool((out["bcast async_"] == 2).all())
        assert out["bcast grad"].tolist() == ([2.0, 2.0] if rank == 1 else [0.0, 0.0])
        sent_to_me = [torch.arange(sum(splits[j]) * 2).view(-1, 2)[sum(splits[j][:rank]):][:splits[j][rank]] + 100 * j
                      for j in range(SIZE)]
        assert torch.equal(out["a2a"], torch.cat(sent_to_me)) and torch.equal(out["a2a async"], out["a2a"])
        assert out["a2a splits"].tolist() == [splits[j][rank] for j in range(SIZE)]
        assert out["a2a splits"].dtype == torch.int32
        assert out["a2a even"].tolist() == [rank, 10 + rank, 20 + rank]
        assert bool((out["a2a grad"] == torch.tensor([1.0, 1, 2, 2, 3, 3])[:, None]).all())  # sent back by row
        mine = slice([0, 3, 5][rank], [3, 5, 7][rank])  # 7 rows: 3, 2, 2
        assert torch.equal(out["rs sum"], seven[mine])
        assert torch.equal(out["rs avg"], (seven[mine].double() * (1 / 3)).float())  # Horovod's scaling rule
        assert torch.equal(out["rs grouped"][1], seven[:4][[slice(0, 2), slice(2, 3), slice(3, 4)][rank]])
        assert out["objects"] == ([{"rank": 0}, {"rank": 1}, {"rank": 2}], "from 1")


def test_process_sets_run_on_their_ranks_with_world_root_ranks():
    def fn(rank, size):
        evens = hvd.ProcessSet([2, 0])
        hvd.init(process_sets=[evens])
        tail = hvd.add_process_set([1, 2])
        out = {"ids": (evens.process_set_id, tail.process_set_id), "included": (evens.included(), tail.included())}
        with pytest.raises(ValueError, match="exists already"):
            hvd.add_process_set([0, 2])
        for name, ps in (("evens", evens), ("tail", tail)):
            if ps.included():
                total = hvd.allreduce(torch.tensor(rank + 1.0), op=hvd.Sum, process_set=ps)
                root = hvd.broadcast(torch.tensor(rank), root_rank=ps.ranks[-1], process_set=ps)
                out[name] = (ps.rank(), ps.size(), total.item(), root.item())
            else:
                with pytest.raises(ValueError, match="not in"):
                    hvd.allreduce(torch.tensor([1.0]), process_set=ps)
        out["removed"] = hvd.remove_process_set(tail), hvd.remove_process_set(tail), tail.process_set_id
        out["global"] = hvd.remove_process_set(hvd.global_process_set), hvd.global_process_set.size()
        hvd.shutdown()
        return out

    results = run_ranks(fn, SIZE)
    for rank, out in enumerate(results):
        assert out["ids"] == (1, 2) and out["included"] == (rank != 1, rank != 0)
        assert out["removed"] == (True, False, None) and out["global"] == (False, 3)
    assert [results[r]["evens"] for r in (0, 2)] == [(0, 2, 4.0, 2), (1, 2, 4.0, 2)]  # ranks 0, 2: 1 + 3
    assert [results[r]["tail"] for r in (1, 2)] == [(0, 2, 5.0, 2), (1, 2, 5.0, 2)]  # ranks 1, 2: 2 + 3


def test_join_answers_the_reductions_of_ranks_with_more_data():
    def fn(rank, size):
        sums = [hvd.allreduce(torch.tensor([1.0, 2.0]), op=hvd.Sum) for _ in range(rank + 1)]
        late = {}
        if rank == 2:  # ranks 0 and 1 have joined: they give the op's identity, Average still divides by 3
            late = {"min": hvd.allreduce(torch.tensor([5.0]), op=hvd.Min),
                    "avg": hvd.allreduce(torch.tensor([6, -6])),
                    "adasum": hvd.allreduce(torch.tensor([3.0, 4.0]), op=hvd.Adasum)}
        last = hvd.join()
        after = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)  # everyone is back
        return sums, late, last, after

    results = run_hvd(fn, SIZE)
    for rank, (sums, _late, last, after) in enumerate(results):
        assert [s.tolist() for s in sums] == [[3.0, 6.0], [2.0, 4.0], [1.0, 2.0]][:rank + 1]
        assert last == 2 and after.item() == 3.0
    late = results[2][1]
    assert late["min"].item() == 5.0 and late["avg"].tolist() == [2, -2] and late["adasum"].tolist() == [3.0, 4.0]


def test_one_rank_and_the_queries():
    with pytest.raises(ValueError, match="hvd.init"):
        hvd.rank()

    def fn(rank, size):
        hvd.init()
        hvd.init()  # a second call does nothing
        out = [hvd.is_initialized(), hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
               hvd.cross_size(), hvd.allreduce(torch.tensor([3])).item(), hvd.allgather(torch.ones(2, 1)).shape,
               hvd.join()]
        queries = [hvd.mpi_built, hvd.mpi_enabled, hvd.mpi_threads_supported, hvd.gloo_built, hvd.gloo_enabled,
                   hvd.nccl_built, hvd.ddl_built, hvd.ccl_built, hvd.cuda_built, hvd.rocm_built]
        out.append([q() for q in queries])
        hvd.shutdown()
        out.append(hvd.is_initialized())
        return out

    assert run_ranks(fn, 1) == [[True, 0, 1, 0, 1, 0, 1, 3, (2, 1), 0, [False] * 10, False]]


def test_alltoall_refuses_ranks_of_different_dtypes():
    def fn(rank, size):
        from allreduce import Mismatch

        tensor = torch.ones(size, dtype=torch.float32 if rank == 0 else torch.int32)
        with pytest.raises(Mismatch) as refused:
            hvd.alltoall(tensor, splits=torch.ones(size, dtype=torch.int32))
        return "float32" in str(refused.value) and "int32" in str(refused.value)

    assert run_hvd(fn, 2) == [True, True]
