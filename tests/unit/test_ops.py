"""Reduce ops: foreign ops translated by name (never read as our numbers), and MIN/MAX kernels whose
bits do not depend on the operands' order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from allreduce import MPI
from allreduce.arguments import checked_op
from allreduce.dtypes import bfloat16
from allreduce.ops import ReduceOp, as_op, check_op, kernel

NAMES = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"]
MPI_NAMES = {"SUM": "SUM", "PROD": "PRODUCT", "MIN": "MIN", "MAX": "MAX", "BAND": "BAND", "BOR": "BOR",
             "BXOR": "BXOR"}


def test_our_ops_and_values():
    assert [as_op(ReduceOp[n]) for n in NAMES] == [ReduceOp[n] for n in NAMES]
    assert as_op(2) is ReduceOp.MIN and as_op(np.int64(3)) is ReduceOp.MAX
    for bad in (8, -1, True, 2.0, "SUM", None):
        with pytest.raises(TypeError):
            as_op(bad)


def test_torch_ops_by_name():
    dist = pytest.importorskip("torch.distributed")
    for name in NAMES:
        torch_op = getattr(dist.ReduceOp, name)
        assert as_op(torch_op) is ReduceOp[name]
        assert as_op(dist.ReduceOp(torch_op)) is ReduceOp[name]
    with pytest.raises(TypeError, match="PREMUL_SUM"):
        as_op(dist.ReduceOp.PREMUL_SUM)


def test_the_cache_does_not_confuse_a_torch_op_with_ours():
    dist = pytest.importorskip("torch.distributed")
    i32 = np.dtype(np.int32)
    for name in NAMES[:-1]:  # ours cached first: torch's MIN is 3, our MAX
        checked_op(ReduceOp[name], i32)
    for name in NAMES[:-1]:
        assert checked_op(getattr(dist.ReduceOp, name), i32) is ReduceOp[name]
    with pytest.raises(TypeError, match="AVG"):  # torch's AVG (1) is not our PRODUCT
        checked_op(dist.ReduceOp.AVG, i32)


def test_mpi_ops_by_name():
    mpi4py = pytest.importorskip("mpi4py.MPI")
    for theirs, ours in MPI_NAMES.items():
        assert as_op(getattr(mpi4py, theirs)) is ReduceOp[ours]
        assert as_op(getattr(MPI, theirs)) is ReduceOp[ours]
    for name in ("LAND", "MAXLOC"):
        with pytest.raises(TypeError, match=name):
            check_op(getattr(mpi4py, name), np.dtype(np.int32))
        with pytest.raises(TypeError, match=name):
            as_op(getattr(MPI, name))


def test_horovod_resolves_torch_ops_by_name():
    dist = pytest.importorskip("torch.distributed")
    from allreduce.torch.horovod.reductions import resolve_op

    assert resolve_op(dist.ReduceOp.MIN) is ReduceOp.MIN
    assert resolve_op(dist.ReduceOp.AVG) is ReduceOp.AVG
    with pytest.raises(ValueError):
        resolve_op(dist.ReduceOp.BXOR)  # 7, our AVG, but not one of Horovod's


FLOATS = [np.dtype(d) for d in ("float16", "float32", "float64")] + ([bfloat16] if bfloat16 is not None else [])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX], ids=lambda o: o.name)
def test_min_max_bits_do_not_depend_on_order(dtype, op):
    uint = np.dtype(f"u{dtype.itemsize}")
    nan = np.array(np.nan, dtype).view(uint)
    odd_nans = np.array([nan | 1, nan | (1 << (8 * dtype.itemsize - 1)) | 2], uint).view(dtype)
    values = np.concatenate([np.array([0.0, -0.0, 1.0, -1.0], dtype), odd_nans])
    pairs = np.array(list(itertools.product(values, values)), dtype)
    a, b = np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])
    combine = kernel(op, dtype)
    results = [combine(a, b), combine(b, a)]
    for x, y in ((a, b), (b, a)):  # in place into either operand
        into_x, into_y = x.copy(), y.copy()
        results.append(combine(into_x, y, out=into_x))
        results.append(combine(x, into_y, out=into_y))
    assert all(np.array_equal(r.view(uint), results[0].view(uint)) for r in results)
    got = results[0]
    assert np.array_equal(np.isnan(got), np.isnan(a) | np.isnan(b))
    assert (got[np.isnan(got)].view(uint) == nan).all()
    tie = (a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))
    assert (np.signbit(got[tie]) == (op is ReduceOp.MIN)).all()


def test_other_kernels_stay_plain_ufuncs():
    assert kernel(ReduceOp.MIN, np.dtype(np.int32)) is np.minimum
    assert kernel(ReduceOp.SUM, np.dtype(np.float32)) is np.add


def test_min_max_fix_ups_reach_any_shape_and_strides():
    a = np.array([[0.0, -0.0], [np.nan, 1.0]], np.float32)
    got = kernel(ReduceOp.MIN, a.dtype)(a, np.array([[-0.0, 0.0], [1.0, np.nan]], np.float32))
    assert np.signbit(got[0]).all() and np.isnan(got[1]).all()
    x, y = np.zeros(8, np.float32), -np.zeros(8, np.float32)
    kernel(ReduceOp.MIN, x.dtype)(x[::2], y[::2], out=x[::2])  # a strided out, written where it lies
    assert np.signbit(x).tolist() == [True, False] * 4
