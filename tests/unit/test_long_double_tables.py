"""numpy's long double in the core tables: its wire codes (appended, never renumbering the others), the
ops it takes, and MIN/MAX bits that do not depend on the operands' order (its sign is not its
item's top bit, so the fix-up differs from the other floats')."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from allreduce import dtypes, ops
from allreduce.ops import ReduceOp

pytestmark = pytest.mark.skipif(np.dtype(np.longdouble) == np.dtype(np.float64), reason="long double is double here")


def test_codes_only_append():
    """bfloat16 keeps 15 with or without ml_dtypes; long double takes 16, its complex 17."""
    assert dtypes.code_of(np.longdouble) == 16 and dtypes.code_of(np.clongdouble) == 17
    assert dtypes.dtype_of(16) == np.longdouble and dtypes.dtype_of(17) == np.clongdouble
    assert [dtypes.code_of(d) for d in ("bool", "float64", "complex128")] == [1, 12, 14]
    if dtypes.bfloat16 is not None:
        assert dtypes.code_of(dtypes.bfloat16) == 15
    else:
        assert dtypes.dtype_of(15) == np.uint8  # unknown: 15 stays free for it
    with pytest.raises(TypeError, match="native byte order"):
        dtypes.code_of(np.dtype(np.longdouble).newbyteorder())


def test_ops_of_long_doubles_are_those_of_floats_and_complexes():
    assert ops.allowed_ops(np.longdouble) == ops.allowed_ops(np.float64)
    assert ops.allowed_ops(np.clongdouble) == ops.allowed_ops(np.complex128)
    with pytest.raises(TypeError):
        ops.check_op(ReduceOp.BAND, np.longdouble)


@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX], ids=lambda o: o.name)
def test_min_max_of_long_doubles_do_not_depend_on_order(op):
    dtype = np.dtype(np.longdouble)
    values = np.array([0.0, -0.0, 1.0, -1.0, np.nan, -np.nan, np.inf], dtype) + np.array(
        [0, 0, 2.0 ** -60, 0, 0, 0, 0], dtype)
    pairs = np.array(list(itertools.product(values, values)), dtype)
    a, b = np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])
    combine = ops.kernel(op, dtype)
    results = [combine(a, b), combine(b, a), combine(a.copy(), b, out=None)]
    into_b = b.copy()
    results.append(combine(a, into_b, out=into_b))
    for got in results:
        assert np.array_equal(got, results[0], equal_nan=True)
        assert np.array_equal(np.signbit(got), np.signbit(results[0]))
    got = results[0]
    nan = np.isnan(a) | np.isnan(b)
    assert np.array_equal(np.isnan(got), nan) and not np.signbit(got[nan]).any()
    tie = (a == 0) & (b == 0)
    assert (np.signbit(got[tie]) == (np.signbit(a[tie]) | np.signbit(b[tie]) if op is ReduceOp.MIN
                                     else np.signbit(a[tie]) & np.signbit(b[tie]))).all()
    plain = ~nan & ~tie
    want = np.minimum(a, b) if op is ReduceOp.MIN else np.maximum(a, b)
    assert np.array_equal(got[plain], want[plain])
