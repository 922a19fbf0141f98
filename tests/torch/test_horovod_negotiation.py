"""Horovod's negotiation (``import allreduce.torch as hvd``): operations pair up by name, a mismatch is
refused on every rank before data moves and the set stays usable, names in flight are unique, ranks
that wait for operations that never pair up are told so, and a joined rank refuses all but reductions.

Every rank checks its own results against a reference computed here from small integers (exact).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.hvd_harness import run_hvd

import allreduce.torch as hvd
from allreduce import Mismatch

SIZE = 3


def refused(call) -> str:
    """The message of the Mismatch ``call()`` raises (a RuntimeError, as Horovod's)."""
    with pytest.raises(Mismatch) as caught:
        call()
    assert isinstance(caught.value, RuntimeError)
    return str(caught.value)


def test_a_mismatch_is_refused_on_every_rank_and_the_set_stays_usable():
    def fn(rank, size):
        out = {}
        ones = torch.ones(6)
        out["dtype"] = refused(lambda: hvd.allreduce(ones.int() if rank == 1 else ones, op=hvd.Sum))
        out["shape"] = refused(lambda: hvd.allreduce(ones.view(2, 3) if rank == 2 else ones.view(3, 2)))
        out["op"] = refused(lambda: hvd.allreduce(ones, op=hvd.Max if rank == 0 else hvd.Min))
        out["factor"] = refused(lambda: hvd.allreduce(ones, prescale_factor=1.0 + (rank == 1)))
        out["root"] = refused(lambda: hvd.broadcast(ones, root_rank=rank))
        out["trailing"] = refused(lambda: hvd.allgather(torch.ones(2, 2 + (rank == 1))))
        out["rs shape"] = refused(lambda: hvd.reducescatter(torch.ones(3 + rank, 2)))
        out["a2a dtype"] = refused(lambda: hvd.alltoall(torch.ones(size, dtype=torch.int64 if rank else torch.float32)))
        out["after"] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum).item()
        return out

    for out in run_hvd(fn, SIZE):
        assert "mismatched dtype" in out["dtype"] and "torch.int32" in out["dtype"]
        assert "mismatched shapes" in out["shape"] and "[[3, 2]]" in out["shape"] and "[[2, 3]]" in out["shape"]
        assert "mismatched op" in out["op"] and "mismatched prescale_factor" in out["factor"]
        assert "mismatched root_rank" in out["root"] and "mismatched trailing shapes" in out["trailing"]
        assert "mismatched shapes" in out["rs shape"] and "mismatched dtype" in out["a2a dtype"]
        assert out["after"] == 6.0


def test_names_pair_operations_issued_in_different_orders():
    def fn(rank, size):
        x, y = torch.full((5,), rank + 1.0), torch.full((3, 2), 10.0 * rank)
        order = ["x", "y"] if rank % 2 == 0 else ["y", "x"]
        handles = {n: hvd.allreduce_async(x if n == "x" else y, name=n, op=hvd.Sum) for n in order}
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce_async(x, name=order[0])
        same_name_other_kind = hvd.broadcast(torch.tensor([rank]), root_rank=1, name="x").item()
        results = {n: hvd.synchronize(handles[n]) for n in reversed(order)}
        return results["x"], results["y"], same_name_other_kind

    for x, y, other in run_hvd(fn, SIZE):
        assert torch.equal(x, torch.full((5,), 6.0)) and torch.equal(y, torch.full((3, 2), 30.0)) and other == 1


def test_a_rank_may_leave_an_operation_pending_across_another():
    def fn(rank, size):
        handle = hvd.allreduce_async(torch.tensor([rank + 1]), name="late", op=hvd.Sum) if rank == 0 else None
        pending = hvd.poll(handle) if rank == 0 else None
        hvd.barrier()  # rank 0's "late" waits for the others, who have not asked for it yet
        if rank != 0:
            handle = hvd.allreduce_async(torch.tensor([rank + 1]), name="late", op=hvd.Sum)
        hvd.barrier()
        return pending, hvd.synchronize(handle).item()

    assert run_hvd(fn, SIZE) == [(False, 6)] + [(None, 6)] * (SIZE - 1)


def test_ranks_waiting_for_operations_that_never_pair_up_are_told_which():
    def fn(rank, size):
        message = refused(lambda: hvd.allreduce(torch.ones(2), name=f"mine{rank}"))
        return message, hvd.allgather_object(rank)

    for message, gathered in run_hvd(fn, SIZE):
        assert "no operation can run" in message
        assert all(f"rank {r} for 'allreduce.mine{r}'" in message for r in range(SIZE))
        assert gathered == list(range(SIZE))


def test_a_joined_rank_serves_reductions_and_refuses_the_rest():
    def fn(rank, size):
        out = {}
        if rank == 0:
            out["last"] = hvd.join()
        else:
            out["sum"] = hvd.allreduce(torch.tensor([rank * 1.0]), op=hvd.Sum).item()
            out["gather"] = refused(lambda: hvd.allgather(torch.ones(1)))
            out["bcast"] = refused(lambda: hvd.broadcast(torch.ones(1), root_rank=1))
            out["last"] = hvd.join()
        out["after"] = hvd.allgather(torch.tensor([rank])).tolist()
        return out

    results = run_hvd(fn, SIZE)
    for rank, out in enumerate(results):
        assert out["last"] == SIZE - 1 and out["after"] == list(range(SIZE))
        if rank:
            assert out["sum"] == 3.0 and "have joined" in out["gather"] and "have joined" in out["bcast"]


def test_float32_factors_scale_in_float32_and_integers_in_float64():
    factor = 0.3  # not a float32: scaling in float64 and rounding once gives other bits
    data = torch.arange(1.0, 40.0) / 7

    def fn(rank, size):
        x = data if rank == 0 else torch.zeros_like(data)  # adding zeros: the sum is exact in any order
        return (hvd.allreduce(x, op=hvd.Sum, prescale_factor=factor),
                hvd.allreduce(x, op=hvd.Sum, postscale_factor=factor),
                hvd.allreduce(torch.arange(-5, 6), op=hvd.Sum, postscale_factor=factor))

    in_float32 = data * torch.tensor(factor, dtype=torch.float32)
    assert not torch.equal(in_float32, (data.double() * factor).float())  # the test can tell them apart
    ints = (torch.arange(-5, 6).double() * SIZE * factor).long()  # float64, truncated toward zero
    for pre, post, scaled_ints in run_hvd(fn, SIZE):
        assert torch.equal(pre, in_float32) and torch.equal(post, in_float32) and torch.equal(scaled_ints, ints)


def test_reducescatter_is_differentiable_with_horovods_gradient():
    def fn(rank, size):
        x = torch.arange(14.0).view(7, 2).requires_grad_()
        y = torch.ones(4, 3, requires_grad=True)
        summed = hvd.reducescatter(x, op=hvd.Sum)
        (summed * (rank + 1)).sum().backward()
        sum_grad = x.grad.clone()
        parts = hvd.grouped_reducescatter([x * 1, y * 1], op=hvd.Average, prescale_factor=2.0)
        x.grad = None
        sum((p * (rank + 1)).sum() for p in parts).backward()
        return summed, sum_grad, parts, x.grad, y.grad

    rows = [3, 2, 2]  # 7 rows over 3 ranks: the first 7 % 3 ranks get one more
    weight = torch.cat([torch.full((n, 1), r + 1.0) for r, n in enumerate(rows)])  # rank r's rows: r + 1
    for rank, (summed, sum_grad, parts, x_grad, y_grad) in enumerate(run_hvd(fn, SIZE)):
        start = sum(rows[:rank])
        assert torch.equal(summed, torch.arange(14.0).view(7, 2)[start:start + rows[rank]] * SIZE)
        assert torch.equal(sum_grad, (weight * SIZE).expand(7, 2))  # Sum: times the set's size
        assert torch.equal(parts[0], torch.arange(14.0).view(7, 2)[start:start + rows[rank]] * 2)
        assert parts[1].shape == (2 if rank == 0 else 1, 3)
        assert torch.equal(x_grad, (weight * 2).expand(7, 2))  # gathered output gradients times the factor
        y_weight = torch.tensor([1.0, 1.0, 2.0, 3.0])[:, None].expand(4, 3)
        assert torch.equal(y_grad, y_weight * 2)


def test_sparse_allreduce_async_matches_the_dense_average():
    def fn(rank, size):
        dense = torch.zeros(6, 3)
        dense[rank], dense[5, rank] = rank + 1.0, 2.0
        wait = hvd.sparse_allreduce_async(dense.to_sparse(), name="emb", op=hvd.Average)
        return wait().to_dense()

    expected = torch.zeros(6, 3)
    for r in range(SIZE):
        expected[r] += (r + 1.0) / SIZE
        expected[5, r] += 2.0 / SIZE
    for result in run_hvd(fn, SIZE):
        assert torch.allclose(result, expected)


def test_announcements_longer_than_a_slot_are_exchanged_whole():
    def fn(rank, size):
        parts = [torch.full((k % 7 + 1, 2), float(rank + k)) for k in range(100)]  # shapes: > 512 bytes of text
        summed = hvd.grouped_allreduce(parts, op=hvd.Sum, name="n" * 600)
        odd = [p.view(-1) if rank == 1 and k == 99 else p for k, p in enumerate(parts)]
        return summed, refused(lambda: hvd.grouped_allreduce(odd, op=hvd.Sum))

    for summed, message in run_hvd(fn, SIZE):
        assert all(torch.equal(s, torch.full((k % 7 + 1, 2), 3.0 * k + 3)) for k, s in enumerate(summed))
        assert "mismatched shapes" in message


def test_a_loop_on_poll_makes_progress():
    def fn(rank, size):
        handle = hvd.allreduce_async(torch.tensor([rank + 1.0]), name="polled", op=hvd.Sum)
        first = hvd.poll(handle)
        if rank == 0:  # the others wait in synchronize; rank 0 only polls (a small sum is done in its round)
            while not hvd.poll(handle):
                pass
        return first, hvd.synchronize(handle).item()

    assert run_hvd(fn, SIZE) == [(False, 6.0)] * SIZE
