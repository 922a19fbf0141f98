"""Reduction operators and the numpy kernels that apply them.

A :class:`ReduceOp` names what to do; :func:`kernel` returns the numpy ufunc that does it in place
(``ufunc(a, b, out=a)``), after :func:`check_op` has refused combinations that make no sense (bitwise
ops on floats, AVG on integers). AVG travels as SUM and is divided by the group size at the end.
"""

from __future__ import annotations

import enum
from typing import Callable

import numpy as np


class ReduceOp(enum.IntEnum):
    """The reduction applied element-wise across ranks (torch.distributed's names)."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6
    AVG = 7


_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
    ReduceOp.AVG: np.add,
}

_BITWISE = {ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}
_ORDERED = {ReduceOp.MIN, ReduceOp.MAX}
_ARITHMETIC = {ReduceOp.SUM, ReduceOp.PRODUCT}


def allowed_ops(dtype: np.dtype) -> frozenset[ReduceOp]:
    """The ops that are meaningful on ``dtype``.

    Integers take everything but AVG (an in-place integer average would silently truncate); floats
    take everything but the bitwise ops; complex numbers have no order, so no MIN/MAX; bool takes
    only the logical ones (MIN = and, MAX = or, and the bitwise trio).
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return frozenset(_ORDERED | _BITWISE)
    if dtype.kind in "iu":
        return frozenset(_ARITHMETIC | _ORDERED | _BITWISE)
    if dtype.kind == "c":
        return frozenset(_ARITHMETIC | {ReduceOp.AVG})
    return frozenset(_ARITHMETIC | _ORDERED | {ReduceOp.AVG})  # floats, float16, bfloat16


def check_op(op: object, dtype: np.dtype) -> ReduceOp:
    """Return ``op`` as a :class:`ReduceOp`, or raise ``TypeError`` if it makes no sense for ``dtype``."""
    try:
        op = ReduceOp(op)  # type: ignore[arg-type]  # anything ReduceOp accepts: a member or its value
    except ValueError:
        raise TypeError(f"unknown reduce op {op!r}; use one of {', '.join(o.name for o in ReduceOp)}") from None
    if op not in allowed_ops(dtype):
        ok = ", ".join(o.name for o in sorted(allowed_ops(dtype)))
        raise TypeError(f"ReduceOp.{op.name} is not defined for dtype {np.dtype(dtype)}; it supports {ok}")
    return op


def kernel(op: ReduceOp) -> np.ufunc:
    """The in-place ufunc that combines two contributions for ``op`` (AVG combines as SUM)."""
    return _UFUNCS[ReduceOp(op)]


def reduce_into(op: ReduceOp, acc: np.ndarray, incoming: np.ndarray, out: np.ndarray | None = None) -> None:
    """``out = acc (op) incoming`` element-wise, with ``out`` defaulting to ``acc`` (no allocation)."""
    _UFUNCS[op](acc, incoming, out=acc if out is None else out)


def finish(op: ReduceOp, result: np.ndarray, group_size: int) -> None:
    """Apply what an op still owes after combining: AVG divides the sum by the number of ranks."""
    if op is ReduceOp.AVG and group_size > 1:
        np.divide(result, group_size, out=result, casting="unsafe")


def finish_reduction(op: ReduceOp, result: np.ndarray, size: int) -> Callable[[], None] | None:
    """The ``after`` callback of a collective that leaves what ``op`` still owes on ``result`` (AVG's
    division by ``size``), or ``None`` when it owes nothing."""
    if op is not ReduceOp.AVG:
        return None
    return lambda: finish(op, result, size)
