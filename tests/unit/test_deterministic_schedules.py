"""Deterministic mode without processes: every schedule the planner may run in that mode, executed
numerically (real floats, the executor's order of operations) on all ranks together, returns the bytes
of the numpy left fold over ranks; and the planner and settings switch as documented."""

from __future__ import annotations

import numpy as np
import pytest
from support.numeric import Numeric
from support.reference import reduced

from allreduce import algorithms, planner
from allreduce.algorithms.schedule import Copy, Region, Schedule
from allreduce.algorithms.verify import ScheduleError, verify, walk
from allreduce.dtypes import bfloat16
from allreduce.ops import ReduceOp, finish
from allreduce.planner import determinism
from allreduce.settings import Settings

DTYPES = [np.dtype(np.float32), np.dtype(np.float64)] + ([bfloat16] if bfloat16 is not None else [])
SIZES = [1, 7, 1000, 2**18]
REDUCING = ("all_reduce", "reduce", "reduce_scatter")


def order_sensitive(dtype: np.dtype, count: int, rank: int) -> np.ndarray:
    """Values of wildly different magnitudes and both signs (signed zeros too), whose sum's bits
    depend on the order of additions."""
    rng = np.random.default_rng([rank, count, dtype.num])
    values = rng.standard_normal(count) * 10.0 ** rng.integers(-6, 7, count)
    values[rng.random(count) < 0.05] = -0.0
    return values.astype(dtype)


def run_numeric(collective: str, name: str, size: int, count: int, dtype: np.dtype, op=ReduceOp.SUM,
                root: int = 0) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
    """Every rank's inputs and final buffers after running ``name`` numerically."""
    entry = algorithms.get(collective, name)
    options = {"hosts": tuple((r,) for r in range(size))} if "hosts" in entry.needs else {}
    schedules = [entry(rank, size, count, root=root, **options) for rank in range(size)]
    per_rank = size * count if collective == "reduce_scatter" else count
    inputs = [order_sensitive(dtype, per_rank, rank) for rank in range(size)]
    out = count if collective == "reduce_scatter" else 0
    buffers = [{"data": x.copy(), "out": np.zeros(out, dtype), "tmp": np.zeros(s.tmp, dtype)}
               for x, s in zip(inputs, schedules)]
    walk(schedules, [{buf: len(a) for buf, a in b.items()} for b in buffers], Numeric(buffers, op))
    return inputs, buffers


def results(collective: str, buffers: list[dict[str, np.ndarray]], count: int, root: int) -> dict[int, np.ndarray]:
    """The arrays each rank must hold the fold in: the tensor, the root's tensor, or each rank's block."""
    if collective == "all_reduce":
        return {r: b["data"] for r, b in enumerate(buffers)}
    if collective == "reduce":
        return {root: buffers[root]["data"]}
    return {r: b["out"] for r, b in enumerate(buffers)}


def check_left_fold(collective: str, name: str, size: int, count: int, dtype: np.dtype, op=ReduceOp.SUM,
                    root: int = 0) -> None:
    inputs, buffers = run_numeric(collective, name, size, count, dtype, op, root)
    for rank, got in results(collective, buffers, count, root).items():
        part = slice(rank * count, (rank + 1) * count) if collective == "reduce_scatter" else slice(None)
        want = reduced(op, [x[part] for x in inputs])
        finish(op, got, size)  # AVG's division, after the schedule, as the group does it
        assert got.tobytes() == want.tobytes(), f"{collective}/{name} rank {rank}/{size} count {count} {dtype}"


@pytest.mark.parametrize("size", range(2, 9))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_all_reduce_algorithm_gives_the_left_fold_in_deterministic_mode(size, dtype):
    for count in SIZES:
        runs = {planner.choose("all_reduce", name, count * dtype.itemsize, size, dtype=dtype, in_rank_order=True)
                for name in ["auto", *algorithms.names("all_reduce")]}  # what runs when each one is asked for
        for chosen in sorted(runs):
            check_left_fold("all_reduce", chosen, size, count, dtype)


@pytest.mark.parametrize("collective", ["reduce", "reduce_scatter"])
@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_reduce_and_reduce_scatter_give_the_left_fold(collective, size):
    for dtype in DTYPES:
        for count in (1, 7, 1000):
            for name in algorithms.names(collective):
                chosen = planner.choose(collective, name, count * dtype.itemsize, size, dtype=dtype,
                                        in_rank_order=True)
                for root in {0, size - 1} if collective == "reduce" else {0}:
                    check_left_fold(collective, chosen, size, count, dtype, root=root)


@pytest.mark.parametrize("op", [ReduceOp.PRODUCT, ReduceOp.AVG])
def test_products_and_averages_fold_in_rank_order_too(op):
    for collective in REDUCING:
        check_left_fold(collective, "ordered", 6, 999, np.dtype(np.float32), op)


def test_the_inputs_are_order_sensitive():
    """Without the mode, the ring and tree differ from the left fold: the tests above can fail."""
    for name in ("ring", "tree", "rabenseifner"):
        with pytest.raises(AssertionError):
            check_left_fold("all_reduce", name, 4, 1000, np.dtype(np.float32))


@pytest.mark.parametrize("collective", REDUCING)
def test_ordered_schedules_are_correct_symbolically(collective):
    for size in (1, 2, 3, 4, 7, 9):
        for count in (0, 1, size - 1, size + 1, 1000):
            for root in range(size) if collective == "reduce" else (0,):
                verify(collective, "ordered", size, count, root)


def test_reducing_copies_must_not_partly_overlap():
    bad = [Copy(Region("data", 0, 4), Region("data", 2, 6), reduce=Region("data", 2, 6))]
    with pytest.raises(ScheduleError, match="partly overlaps"):
        walk([Schedule((tuple(bad),))], [{"data": 8, "out": 0, "tmp": 0}], Numeric([{"data": np.zeros(8)}]))


def test_planner_runs_only_rank_order_algorithms_in_deterministic_mode():
    for size in (3, 4, 16):
        for nbytes in (8, 1 << 16, 64 << 20):
            for requested in ("auto", "ring", "tree", "hierarchical"):
                chosen = planner.choose("all_reduce", requested, nbytes, size, in_rank_order=True, forced="direct")
                assert algorithms.get("all_reduce", chosen).in_rank_order
    assert planner.choose("all_reduce", "tree", 8, 2, in_rank_order=True) == "tree"  # any order at 2 ranks
    assert planner.choose("reduce_scatter", "ring", 8, 4, in_rank_order=True) == "ordered"
    assert planner.choose("all_reduce", "ring", 8, 4) == "ring"


def test_the_mode_follows_the_api_over_the_environment(monkeypatch):
    monkeypatch.setattr(determinism, "_chosen", None)
    on, off = Settings(deterministic="1"), Settings()
    assert determinism.enabled(on) and not determinism.enabled(off)
    assert determinism.order_matters(ReduceOp.SUM, np.dtype(np.float32))
    assert not determinism.order_matters(ReduceOp.MAX, np.dtype(np.float32))
    assert not determinism.order_matters(ReduceOp.SUM, np.dtype(np.int64))  # integer sums: any order
    determinism.use_deterministic_algorithms(False)
    assert not determinism.enabled(on)
    determinism.use_deterministic_algorithms(True)
    assert determinism.enabled(off)
    with pytest.raises(ValueError, match="ALLREDUCE_DETERMINISTIC"):
        Settings.from_env({"ALLREDUCE_DETERMINISTIC": "yes"})
