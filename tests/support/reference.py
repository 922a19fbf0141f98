"""Inputs with exactly known results, and the numpy reference every collective is checked against.

Inputs are small integers (in every dtype), so sums, products and averages are exact whatever order
an algorithm combines them in: a mismatch is a real bug, never rounding.
"""

from __future__ import annotations

import functools

import numpy as np

from allreduce.ops import ReduceOp


def counts_for(size: int) -> list[int]:
    """Counts that break naive code: empty, one, smaller than the world, primes, not divisible by it."""
    return sorted({0, 1, 2, max(size - 1, 0), size, size + 1, 7, 13, 64, 1000})


def make_input(dtype, count: int, rank: int, op: ReduceOp = ReduceOp.SUM, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input: any rank can rebuild any other rank's."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([salt, rank, count, dtype.num, int(op)])
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(bool)
    if op is ReduceOp.PRODUCT:
        values = rng.integers(1, 3, count)
    elif dtype.kind == "u" or op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        values = rng.integers(0, 10, count)
    else:
        values = rng.integers(-4, 6, count)
    if dtype.kind == "c":
        return (values + 1j * rng.integers(-3, 4, count)).astype(dtype)
    return values.astype(dtype)


def reduced(op: ReduceOp, arrays: list[np.ndarray]) -> np.ndarray:
    """``op`` over ``arrays`` element-wise, in the arrays' dtype (AVG = SUM / n, as the library does)."""
    ufunc = {
        ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
        ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
        ReduceOp.BXOR: np.bitwise_xor,
    }[op]
    result = functools.reduce(lambda a, b: ufunc(a, b).astype(a.dtype), arrays).copy()
    if op is ReduceOp.AVG and len(arrays) > 1:
        np.divide(result, len(arrays), out=result, casting="unsafe")
    return result


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and values (+0.0 and -0.0 are equal: a product's sign of zero depends on order)."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def left_fold_misses(all_reduce, rank: int, size: int, count: int) -> list[str]:
    """Sums, averages and products of ``count`` values whose rounding depends on the order, through
    ``all_reduce(array, op)``: the (dtype, op) pairs whose result is not the exact bits of
    ``((x0 + x1) + x2) + ...``."""
    from allreduce.dtypes import bfloat16

    wrong = []
    for dtype in (np.float32, np.float64, bfloat16 or np.float16):
        for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT):
            inputs = [np.random.default_rng([r, int(op)]).normal(size=count).astype(dtype) for r in range(size)]
            x = inputs[rank].copy()
            all_reduce(x, op)
            want = inputs[0].copy()
            ufunc = np.multiply if op is ReduceOp.PRODUCT else np.add
            for other in inputs[1:]:
                ufunc(want, other, out=want)
            if op is ReduceOp.AVG:
                np.divide(want, size, out=want, casting="unsafe")
            if x.tobytes() != want.tobytes():
                wrong.append(f"{np.dtype(dtype)} {op.name}")
    return wrong


def reduction_misses(rank: int, size: int, dtype: np.dtype, op: ReduceOp, count: int,
                     make=make_input) -> list[str]:
    """An all-reduce and a reduce (to rank ``count % size``) of ``count`` inputs (``make(dtype, count,
    rank, op)``) through the default group, against numpy: a line for each that came out wrong."""
    import allreduce as dist

    inputs = [make(dtype, count, r, op) for r in range(size)]
    misses = []
    x = inputs[rank].copy()
    dist.all_reduce(x, op=op)
    if not same(x, reduced(op, inputs)):
        misses.append(f"all_reduce {dtype} {op.name} count={count}")
    root = count % size
    x = inputs[rank].copy()
    dist.reduce(x, dst=root, op=op)
    if not same(x, reduced(op, inputs) if rank == root else inputs[rank]):
        misses.append(f"reduce {dtype} {op.name} count={count} root={root}")
    return misses


def all_gather_misses(rank: int, size: int, dtype: np.dtype, count: int, placed=np.array) -> list[str]:
    """An all-gather of ``count`` inputs through the default group into arrays that ``placed`` makes
    from their initial values (anywhere in memory it likes), against numpy: a line if it came out wrong."""
    import allreduce as dist

    outs = [placed(np.zeros(count, dtype)) for _ in range(size)]
    dist.all_gather(outs, placed(make_input(dtype, count, rank)))
    if all(same(o, make_input(dtype, count, r)) for r, o in enumerate(outs)):
        return []
    return [f"all_gather {dtype} count={count}"]
