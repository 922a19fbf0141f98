"""The compiled reduction kernels give numpy's bits (``ops.kernel``, ``ops.finish``) for every pair
they support, on values that break naive code: zeros of both signs, infinities, NaNs, subnormals,
ties of rounding, integer extremes; and they support every pair the engines expect them to."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce import dtypes, ops
from allreduce.ops import ReduceOp

kernels = pytest.importorskip("allreduce.native._kernels", reason="the compiled engine is not built")

FLOATS = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)] + (
    [dtypes.bfloat16] if dtypes.bfloat16 is not None else [])
INTS = [np.dtype(n) for n in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")]


def _operands(dtype: np.dtype, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of ``n`` items: random bits (every pattern, NaNs and subnormals included) mixed with
    the special values of the dtype, in every pairing."""
    a, b = (rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).copy() for _ in "ab")
    if dtype == np.bool_:
        return a.view(np.uint8) % 2 == 1, b.view(np.uint8) % 2 == 1
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        special = np.array([0, 1, -1 if dtype.kind == "i" else 2, info.min, info.max, info.max - 1], dtype=dtype)
    else:
        special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, 3.0, 65504.0, 1e-7, -1e-40],
                           dtype=np.float64).astype(dtype)
    pairs = np.array(np.meshgrid(np.arange(len(special)), np.arange(len(special)))).reshape(2, -1)
    k = min(n, pairs.shape[1])
    a[:k], b[:k] = special[pairs[0, :k]], special[pairs[1, :k]]
    if dtype.kind == "f" or dtype == dtypes.bfloat16:  # small values: sums that round, products that are exact
        small = rng.standard_normal(n // 4).astype(dtype)
        a[k:k + len(small)] = small
    return a, b


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


PAIRS = [(dtype, op) for dtype in dtypes.SUPPORTED for op in ReduceOp if op in ops.allowed_ops(dtype)]


@pytest.mark.parametrize("dtype, op", PAIRS, ids=[f"{d}-{o.name}" for d, o in PAIRS])
def test_fold_has_numpys_bits(dtype, op):
    code = dtypes.code_of(dtype)
    if not kernels.supported(code, int(op)):
        long_double = dtype.type in (np.longdouble, np.clongdouble)  # numpy's folds, no compiled loop
        assert long_double or (dtype.kind == "c" and op is not ReduceOp.SUM), f"{dtype} {op.name} should be compiled"
        return
    rng = np.random.default_rng(code * 10 + int(op))
    for n in (0, 1, 7, 1031):
        a, b = _operands(dtype, n, rng)
        want = np.empty_like(a)
        with np.errstate(all="ignore"):
            ops.kernel(op, dtype)(a, b, out=want)
        got = np.empty_like(a)
        kernels.fold(code, int(op), got, a, b)
        if dtype.kind in "fc" or dtype == dtypes.bfloat16 and op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVG):
            # NaN payloads of arithmetic are the hardware's; NaN-ness and every other value match
            nan = np.isnan(want)
            np.testing.assert_array_equal(np.isnan(got), nan)
            _same_bits(got[~nan], want[~nan])
        else:
            _same_bits(got, want)
        again = a.copy()  # in place, as the engines fold: dst is a
        kernels.fold(code, int(op), again, again, b)
        _same_bits(again, got)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("size", [2, 3, 7, 257, 2049])
def test_avg_finish_divides_as_numpy(dtype, size):
    code = dtypes.code_of(dtype)
    a = np.random.default_rng(size).standard_normal(1000).astype(dtype)
    want = a.copy()
    ops.finish(ReduceOp.AVG, want, size)
    got = a.copy()
    kernels.finish(code, int(ReduceOp.AVG), got, size)
    _same_bits(got, want)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16)] + ([dtypes.bfloat16] if dtypes.bfloat16 else []), ids=str)
def test_every_half_pair_row_rounds_as_numpy(dtype):
    """Every 16-bit pattern against a few operands: each rounding case of the narrow types."""
    code = dtypes.code_of(dtype)
    a = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    for other in (1.0, -0.0, 3.0, 1e-3, 0.1, 2.0 ** -14, 1000.0):
        b = np.full_like(a, other)
        for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX):
            want = np.empty_like(a)
            with np.errstate(all="ignore"):
                ops.kernel(op, dtype)(a, b, out=want)
            got = np.empty_like(a)
            kernels.fold(code, int(op), got, a, b)
            nan = np.isnan(want)
            np.testing.assert_array_equal(np.isnan(got), nan)
            _same_bits(got[~nan], want[~nan])


def test_refuses_what_it_cannot_reduce():
    f32 = dtypes.code_of(np.float32)
    assert not kernels.supported(f32, int(ReduceOp.BAND))
    assert not kernels.supported(0, 0) and not kernels.supported(99, 0) and not kernels.supported(f32, 99)
    with pytest.raises(ValueError):
        kernels.fold(f32, int(ReduceOp.BAND), np.zeros(2, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32))
    with pytest.raises(ValueError):
        kernels.fold(f32, 0, np.zeros(2, np.float32), np.zeros(3, np.float32), np.zeros(2, np.float32))
    with pytest.raises(ValueError):
        kernels.fold(f32, 0, np.zeros(8, np.uint8)[1:5], np.zeros(1, np.float32), np.zeros(1, np.float32))
