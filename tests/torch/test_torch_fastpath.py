"""The short way of blocking ``dist.all_reduce(t)``, ``dist.broadcast(t, src)`` and ``dist.barrier()``
through the shim: numpy views made (and, for small tensors, kept) in C++, torch's op number or root
instead of an options object, a finished work made in C++.

Every result is checked against numpy's reduction of the inputs each rank computes for itself.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef

from support.torch_harness import run_torch_ranks

OPS = {dist.ReduceOp.SUM: np.add, dist.ReduceOp.PRODUCT: np.multiply, dist.ReduceOp.MIN: np.minimum,
       dist.ReduceOp.MAX: np.maximum, dist.ReduceOp.BAND: np.bitwise_and, dist.ReduceOp.BOR: np.bitwise_or,
       dist.ReduceOp.BXOR: np.bitwise_xor}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8]
# 0 and 1 element, odd counts, past the lines (64 KiB) and past the kept views' bound
COUNTS = [0, 1, 7, 1000, 40_000]
KEPT = 8  # views the shim keeps (shim.cpp, Views::kKept)


def inputs(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Small values that every op reduces exactly in every dtype: 1..3, varying with rank and position."""
    values = (np.arange(count) + rank) % 3 + 1
    return torch.from_numpy(values).to(dtype)


def reference(size: int, count: int, dtype: torch.dtype, op) -> np.ndarray:
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    ranks = [inputs(r, count, dtype).to(wide).numpy() for r in range(size)]
    out = ranks[0]
    for other in ranks[1:]:
        out = OPS[op](out, other)
    return out


def cases():
    for dtype in DTYPES:
        for op in OPS:
            bitwise = op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)
            if bitwise and (dtype.is_floating_point or dtype.is_complex):
                continue
            if dtype.is_complex and op != dist.ReduceOp.SUM:  # torch refuses the others on complex tensors
                continue
            for count in COUNTS:
                yield dtype, op, count


def test_blocking_all_reduce_matches_numpy_for_every_dtype_op_and_count():
    def fn(rank, size):
        got = []
        for dtype, op, count in cases():
            t = inputs(rank, count, dtype)
            dist.all_reduce(t, op=op)
            got.append(t.to(torch.complex128 if dtype.is_complex else torch.float64).numpy())
        avg = inputs(rank, 1000, torch.float32)
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        return got, avg.numpy()

    for got, avg in run_torch_ranks(fn, 2):
        for (dtype, op, count), result in zip(cases(), got, strict=True):
            np.testing.assert_array_equal(result, reference(2, count, dtype, op), err_msg=f"{dtype} {op} {count}")
        np.testing.assert_allclose(avg, reference(2, 1000, torch.float32, dist.ReduceOp.SUM) / 2, rtol=1e-6)


def test_blocking_broadcast_copies_the_roots_tensor_for_every_dtype_and_count():
    def fn(rank, size):
        got = []
        for dtype in DTYPES:
            for count in COUNTS:
                for root in range(size):
                    t = inputs(rank, count, dtype)
                    dist.broadcast(t, src=root)
                    got.append(t.to(torch.complex128 if dtype.is_complex else torch.float64).numpy())
        return got

    for got in run_torch_ranks(fn, 2):
        cases = [(dtype, count, root) for dtype in DTYPES for count in COUNTS for root in range(2)]
        for (dtype, count, root), result in zip(cases, got, strict=True):
            np.testing.assert_array_equal(result, inputs(root, count, dtype).to(torch.complex128).numpy(),
                                          err_msg=f"{dtype} {count} from {root}")


def test_a_blocking_barrier_waits_for_the_last_rank():
    def fn(rank, size):
        dist.barrier()
        if rank == 1:
            time.sleep(0.5)
        start = time.monotonic()
        dist.barrier()
        return time.monotonic() - start

    waited = run_torch_ranks(fn, 2)
    assert waited[0] >= 0.3, waited  # rank 0 cannot leave before rank 1 arrives, half a second later


def test_kept_views_follow_the_memory_of_each_call():
    """Calls on one tensor, on tensors allocated where a freed one was, on slices, on a tensor moved to
    another storage (``set_``) and on a parameter all reduce the memory of the tensor passed."""

    def fn(rank, size):
        got = {}
        t = torch.full((4,), rank + 1.0)
        for _ in range(3):
            dist.all_reduce(t)  # 3, 6, 12 on both ranks: each call sums the previous result
        got["repeated"] = t.tolist()
        for k in range(20):  # allocations that reuse the address of one freed in the loop before
            u = torch.full((4,), float(rank + k))
            dist.all_reduce(u)
            got.setdefault("reused", []).append(u.tolist())
            del u
        base = torch.arange(8.0) * (rank + 1)
        for low in (0, 2, 4):  # same count and dtype at other addresses inside one tensor
            dist.all_reduce(base[low:low + 2])
        got["slices"] = base.tolist()
        moved = torch.full((4,), rank + 1.0)
        dist.all_reduce(moved)  # its view is kept
        moved.set_(torch.full((4,), rank + 1.0))  # another storage: the kept view's address is free again
        fresh = [torch.full((4,), 10.0 * (rank + k)) for k in range(4)]  # one may be allocated there
        for x in [moved, *fresh]:
            dist.all_reduce(x)
        got["moved"] = (moved.tolist(), [f.tolist() for f in fresh])
        weight = torch.nn.Parameter(torch.full((3,), rank + 1.0))
        dist.all_reduce(weight)
        got["parameter"] = (weight.detach().tolist(), weight.requires_grad)
        shaped = [torch.tensor(rank + 1.0), torch.full((3, 4), rank + 1.0), torch.full((2, 1, 3), rank + 1.0)]
        for x in shaped:  # a 0-d tensor and others of several dimensions: flat views of the same memory
            dist.all_reduce(x)
        got["shaped"] = [(tuple(x.shape), x.unique().tolist()) for x in shaped]
        return got

    for rank, got in enumerate(run_torch_ranks(fn, 2)):
        assert got["repeated"] == [12.0] * 4
        assert got["reused"] == [[2.0 * k + 1] * 4 for k in range(20)]
        assert got["slices"] == [3.0 * x for x in range(6)] + [6.0 * (rank + 1), 7.0 * (rank + 1)]
        assert got["moved"] == ([3.0] * 4, [[10.0 * (2 * k + 1)] * 4 for k in range(4)])
        assert got["parameter"] == ([3.0] * 3, True)
        assert got["shaped"] == [((), [3.0]), ((3, 4), [3.0]), ((2, 1, 3), [3.0])]


def test_the_views_keep_only_a_few_small_tensors_memory():
    def fn(rank, size):
        small, big = torch.ones(4), torch.ones(40_000)
        refs = {"small": StorageWeakRef(small.untyped_storage()), "big": StorageWeakRef(big.untyped_storage())}
        dist.all_reduce(small)
        dist.all_reduce(big)
        del small, big
        gc.collect()
        alive = {name: not ref.expired() for name, ref in refs.items()}
        for k in range(KEPT):  # each at a new address: the first view kept is replaced
            dist.all_reduce(torch.ones(k + 1))
        gc.collect()
        return alive, not refs["small"].expired()

    for alive, still in run_torch_ranks(fn, 2):
        assert alive == {"small": True, "big": False}
        assert not still


def test_each_blocking_call_returns_its_own_finished_work():
    def fn(rank, size):
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        options = {kind: kind() for kind in (dist.AllreduceOptions, dist.BroadcastOptions, dist.BarrierOptions)}
        for opts in options.values():
            opts.asyncOp = False  # what dist.all_reduce(t), dist.broadcast(t, 0) and dist.barrier() pass
        first, second = torch.full((2,), rank + 1.0), torch.full((3,), 10.0 * (rank + 1))
        sent = torch.full((2,), float(rank))
        before = backend._get_sequence_number_for_group()
        works = [backend.allreduce([first], options[dist.AllreduceOptions]),
                 backend.allreduce([second], options[dist.AllreduceOptions]),
                 backend.broadcast([sent], options[dist.BroadcastOptions]),
                 backend.barrier(options[dist.BarrierOptions])]
        numbered = backend._get_sequence_number_for_group() - before
        seen = [(w.is_completed(), w.is_success(), w.exception(), w.wait(), w.source_rank()) for w in works]
        values = [[x.tolist() for x in w.get_future().wait()] for w in works]
        results = [[x.tolist() for x in w.result()] for w in works]
        return len({id(w) for w in works}), numbered, seen, values, results

    for distinct, numbered, seen, values, results in run_torch_ranks(fn, 2):
        assert distinct == numbered == 4
        assert seen == [(True, True, None, True, -1)] * 4
        assert values == results == [[[3.0, 3.0]], [[30.0] * 3], [[0.0, 0.0]], []]
