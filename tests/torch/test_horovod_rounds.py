"""Horovod's negotiation rounds (``import allreduce.torch as hvd``): a round whose ranks all announce
the same text settles from a 32-byte digest all-reduce, without gathering the texts; where one rank's
text differs, every rank gathers them, so ranks never disagree on what a round was. Results, refusals,
``join`` and process sets are the same either way, and small sums ride the group's shortcut.

Each rank counts the all-gathers it makes (the texts' exchange is the only all-gather of these calls)
and checks its results against a reference computed here from small integers (exact).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.hvd_harness import run_hvd

import allreduce
import allreduce.torch as hvd
from allreduce import Mismatch
from allreduce.runtime import Shape

SIZES = (2, 3)
COUNTS = (0, 1, 2, 7, 13, 20_011)  # 20,011 float32 pass the at-once limit: those sums run in the background
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


def contribution(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s small integers (negative too: integer averages truncate toward zero)."""
    return torch.arange(count).remainder(11).sub(5).mul(rank + 1).to(dtype)


def expected(op, count: int, dtype: torch.dtype, size: int) -> torch.Tensor:
    """numpy's reference: the exact sum, an Average dividing floats by ``size`` in their dtype and
    scaling integers by ``1/size`` in float64, truncated (Horovod's rule)."""
    total = sum(contribution(r, count, dtype).numpy().astype(np.float64) for r in range(size))
    if op is hvd.Sum:
        result = total
    elif dtype.is_floating_point:
        result = total.astype(torch.empty(0, dtype=dtype).numpy().dtype) / size
    else:
        result = np.trunc(total * (1.0 / size))
    return torch.from_numpy(np.asarray(result)).to(dtype)


class Gathers:
    """Counts this rank's all-gathers, which only the texts' exchange makes here."""

    def __init__(self):
        self.count = 0
        self.inner = allreduce.api.all_gather_into_tensor
        allreduce.api.all_gather_into_tensor = self

    def __call__(self, *args, **kwargs):
        self.count += 1
        return self.inner(*args, **kwargs)

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def ops_and_shapes():
    return [(op, count, dtype) for op in (hvd.Sum, hvd.Average) for count in COUNTS for dtype in DTYPES]


@pytest.mark.parametrize("size", SIZES)
def test_alike_rounds_gather_nothing_and_small_sums_ride_the_shortcut(size):
    def fn(rank, world):
        gathers = Gathers()
        results = []
        for op, count, dtype in ops_and_shapes():
            x = contribution(rank, count, dtype)
            results.append(hvd.allreduce(x, op=op))  # unnamed: a fresh name every call
            results.append(hvd.allreduce(x, op=op, name="same"))
            handle = hvd.allreduce_async_(x.clone(), op=op, name="async")
            results.append(hvd.synchronize(handle))
        group = allreduce.default_group()
        shortcuts = [Shape.all_reduce(np.dtype("float32"), 7, allreduce.ReduceOp.SUM) in group.shortcuts,
                     Shape.all_reduce(np.dtype("uint64"), 4, allreduce.ReduceOp.BAND) in group.shortcuts]
        return results, gathers.take(), shortcuts

    for results, gathered, shortcuts in run_hvd(fn, size):
        want = [expected(op, count, dtype, size) for op, count, dtype in ops_and_shapes() for _ in range(3)]
        assert all(got.dtype == ref.dtype and torch.equal(got, ref) for got, ref in zip(results, want))
        assert gathered == 0
        assert shortcuts == [True, True]


@pytest.mark.parametrize("size", SIZES)
def test_a_round_that_differs_on_one_rank_gathers_on_every_rank(size):
    def fn(rank, world):
        gathers = Gathers()
        out = {}
        out["warm"] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="a").item()
        out["warm gathers"] = gathers.take()
        early = hvd.allreduce_async(torch.tensor([10.0 * rank]), op=hvd.Sum, name="b") if rank == 1 else None
        out["a"] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="a").item()  # rank 1 also says "b"
        out["a gathers"] = gathers.take()
        late = early if rank == 1 else hvd.allreduce_async(torch.tensor([10.0 * rank]), op=hvd.Sum, name="b")
        out["b"] = hvd.synchronize(late).item()
        out["b gathers"] = gathers.take()
        handles = {n: hvd.allreduce_async(torch.tensor([float(rank)]), op=hvd.Sum, name=n) for n in ("x", "y")}
        waited = ("x", "y") if rank % 2 == 0 else ("y", "x")  # one announcement, awaited in other orders
        out["waits"] = [hvd.synchronize(handles[n]).item() for n in waited]
        out["waits gathers"] = gathers.take()
        first, second = ("x", "y") if rank % 2 == 0 else ("y", "x")  # the same operations, in other orders
        handles = {n: hvd.allreduce_async(torch.tensor([float(rank)]), op=hvd.Sum, name=n) for n in (first, second)}
        out["orders"] = [hvd.synchronize(handles[n]).item() for n in ("x", "y")]
        out["orders gathers"] = gathers.take() > 0
        out["after"] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="a").item()
        out["after gathers"] = gathers.take()
        return out

    total, tens = sum(range(1, size + 1)), 10.0 * sum(range(size))
    for out in run_hvd(fn, size):
        assert out["warm"] == out["a"] == out["after"] == total and out["b"] == tens
        assert out["orders"] == out["waits"] == [sum(range(size))] * 2 and out["waits gathers"] == 0
        assert out["warm gathers"] == 0 and out["a gathers"] >= 1 and out["b gathers"] >= 1
        assert out["orders gathers"] and out["after gathers"] == 0


def refused(call) -> str:
    with pytest.raises(Mismatch) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("size", SIZES)
def test_a_mismatch_after_alike_rounds_is_refused_on_every_rank(size):
    def fn(rank, world):
        gathers = Gathers()
        ones = torch.ones(6)
        out = {"before": [hvd.allreduce(ones, op=hvd.Sum, name="w").tolist() for _ in range(3)]}
        out["dtype"] = refused(lambda: hvd.allreduce(ones.double() if rank == 1 else ones, op=hvd.Sum, name="w"))
        out["factor"] = refused(lambda: hvd.allreduce(ones, op=hvd.Sum, name="w", postscale_factor=1.0 + (rank == 0)))
        out["shape"] = refused(lambda: hvd.allreduce(ones.view(2, 3) if rank else ones.view(3, 2)))
        out["refusal gathers"] = gathers.take()
        out["after"] = [hvd.allreduce(ones, op=hvd.Sum, name="w").tolist() for _ in range(3)]
        out["after gathers"] = gathers.take()
        return out

    for out in run_hvd(fn, size):
        assert out["before"] == out["after"] == [[float(size)] * 6] * 3
        assert "mismatched dtype" in out["dtype"] and "mismatched postscale_factor" in out["factor"]
        assert "mismatched shapes" in out["shape"]
        assert out["refusal gathers"] >= 3 and out["after gathers"] == 0


@pytest.mark.parametrize("size", SIZES)
def test_join_between_alike_rounds(size):
    steps = [3, 5, 4][:size]  # rank r runs steps[r] steps, then joins

    def fn(rank, world):
        gathers = Gathers()
        out = {"sums": [], "averages": [], "big": []}
        for step in range(steps[rank]):
            x = contribution(rank, 7, torch.float32) + step
            out["sums"].append(hvd.allreduce(x, op=hvd.Sum, name="g"))
            out["averages"].append(hvd.allreduce(x))  # unnamed: counted from the last join on every rank
            out["big"].append(hvd.allreduce(contribution(rank, COUNTS[-1], torch.float32) + step, name="big"))
        out["last"] = hvd.join()
        gathers.take()
        out["after"] = [hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum) for _ in range(2)]
        out["after gathers"] = gathers.take()
        return out

    for rank, out in enumerate(run_hvd(fn, size)):
        for step in range(steps[rank]):
            active = [r for r in range(size) if steps[r] > step]  # joined ranks contribute zeros
            total = sum(contribution(r, 7, torch.float32) + step for r in active)
            assert torch.equal(out["sums"][step], total)
            assert torch.equal(out["averages"][step], total / size)  # Average divides by the set's size
            big = sum(contribution(r, COUNTS[-1], torch.float32) + step for r in active)
            assert torch.equal(out["big"][step], big / size)  # summed in the background: the same rule
        assert out["last"] == max(range(size), key=lambda r: (steps[r], r))
        assert [t.item() for t in out["after"]] == [float(sum(range(size)))] * 2 and out["after gathers"] == 0


def test_process_sets_keep_rounds_of_their_own():
    size = 3

    def fn(rank, world):
        gathers = Gathers()
        pair = hvd.add_process_set([0, 2])
        out = {"world": hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="v").item()}
        if pair.included():
            out["pair"] = [hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="v",
                                         process_set=pair).item() for _ in range(3)]
        hvd.remove_process_set(pair)
        again = hvd.add_process_set([0, 2])
        if again.included():
            out["again"] = hvd.allreduce(torch.tensor([rank + 1.0]), name="v", process_set=again).item()
        out["world after"] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="v").item()
        out["gathers"] = gathers.take()
        return out

    for rank, out in enumerate(run_hvd(fn, size)):
        assert out["world"] == out["world after"] == 6.0 and out["gathers"] == 0
        if rank in (0, 2):
            assert out["pair"] == [4.0] * 3 and out["again"] == 2.0
        else:
            assert "pair" not in out and "again" not in out


@pytest.mark.parametrize("size", SIZES)
def test_results_land_in_the_callers_tensors_whatever_their_layout(size):
    def fn(rank, world):
        base = contribution(rank, 12, torch.float32).view(3, 4)
        strided = base.t()  # not contiguous: reduced through a copy
        out = {"new": hvd.allreduce(strided, op=hvd.Sum), "input kept": torch.equal(strided, base.t())}
        same = strided.clone().t().contiguous().t()
        out["in place"] = hvd.allreduce_(same, op=hvd.Sum)
        out["is same"] = out["in place"] is same
        out["scalar"] = hvd.allreduce(torch.tensor(rank + 1.0))
        plain = base.clone()
        out["plain in place"] = hvd.allreduce_(plain, op=hvd.Sum) is plain and torch.equal(plain, out["new"].t())
        return out

    total = sum(contribution(r, 12, torch.float32).view(3, 4) for r in range(size))
    for out in run_hvd(fn, size):
        assert torch.equal(out["new"], total.t()) and out["input kept"]
        assert torch.equal(out["in place"], total.t()) and out["is same"] and out["plain in place"]
        assert out["scalar"].shape == () and out["scalar"].item() == sum(range(1, size + 1)) / size
