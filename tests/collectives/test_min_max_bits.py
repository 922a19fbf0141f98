"""MIN and MAX of floats give every rank the same bits, whatever order each rank combines in: a -0/+0
tie is -0 for MIN and +0 for MAX, and any NaN is ``np.nan`` (``allreduce.ops``), on every all-reduce
algorithm, over TCP and shared memory."""

from __future__ import annotations

import numpy as np
import pytest

from support import engines
from support.harness import run_ranks

pytestmark = engines.BOTH  # the lines run in Python and in C

NANS = {np.dtype(np.float32): (0x7FC00001, 0xFFC00002), np.dtype(np.float64): (0x7FF8000000000001, 0xFFF8000000000002)}


def _values(dtype: np.dtype) -> np.ndarray:
    """Two zeros, two NaNs of other payloads and signs, and two plain numbers."""
    uint = np.dtype(f"u{dtype.itemsize}")
    nans = np.array(NANS[dtype], uint).view(dtype)
    return np.concatenate([np.array([0.0, -0.0], dtype), nans, np.array([1.0, -1.0], dtype)])


def _input(dtype: np.dtype, count: int, rank: int) -> np.ndarray:
    return _values(dtype)[np.random.default_rng(rank).integers(0, 6, count)]


def _expected(op_name: str, columns: np.ndarray) -> np.ndarray:
    """The documented result, element by element from every rank's value."""
    out = []
    for vals in columns.T:
        if np.isnan(vals).any():
            out.append(np.nan)
            continue
        best = vals.min() if op_name == "MIN" else vals.max()
        if best == 0:  # MIN: -0 if any rank has -0; MAX: +0 if any rank has +0
            signs = np.signbit(vals[vals == 0])
            best = -0.0 if (signs.any() if op_name == "MIN" else signs.all()) else 0.0
        out.append(best)
    return np.array(out, columns.dtype)


def _bits(rank, size):
    import allreduce as dist
    from allreduce import algorithms
    from allreduce.ops import ReduceOp

    got, wrong = {}, []
    for dtype in NANS:
        for count in (7, 1000):
            columns = np.stack([_input(dtype, count, r) for r in range(size)])
            for op in (ReduceOp.MIN, ReduceOp.MAX):
                want = _expected(op.name, columns).view(np.uint8)
                for algo in algorithms.names("all_reduce"):
                    x = columns[rank].copy()
                    dist.all_reduce(x, op=op, algorithm=algo)
                    got[algo, str(dtype), count, op.name] = x.view(np.uint8).tobytes()
                    if not np.array_equal(x.view(np.uint8), want):
                        wrong.append(f"{algo} {dtype} count={count} {op.name}")
    return got, wrong


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_min_max_same_bits_on_every_rank(size, transport):
    results = run_ranks(_bits, size, deadline=240, env={"ALLREDUCE_TRANSPORT": transport})
    assert [wrong for _, wrong in results] == [[]] * size
    assert all(got == results[0][0] for got, _ in results)
