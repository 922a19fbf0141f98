"""Reduction operators and the numpy kernels that apply them.

A :class:`ReduceOp` names what to do; :func:`kernel` returns the numpy ufunc that does it in place
(``ufunc(a, b, out=a)``), after :func:`check_op` has refused combinations that make no sense (bitwise
ops on floats, AVG on integers). AVG travels as SUM and is divided by the group size at the end.
Another library's op (torch's, mpi4py's) is taken by its name: its number means another op here.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable

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
    return frozenset(_ARITHMETIC | _ORDERED | {ReduceOp.AVG})  # floats, float16, bfloat16, long double


# a foreign op's name -> ours: torch's names, and MPI's PROD
_BY_NAME = {**ReduceOp.__members__, "PROD": ReduceOp.PRODUCT}
_MPI_NAMES = ("SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR", "MINLOC", "MAXLOC")


def _name_of(op: object) -> str | None:
    """The name a foreign op goes by: torch's ``RedOpType`` and ``allreduce.MPI``'s ops carry it, torch's
    ``ReduceOp`` wraps a ``RedOpType`` in ``.op``, and mpi4py's ops are known by identity (imported
    already if ``op`` is one)."""
    if type(op).__module__.startswith("mpi4py"):
        mpi = sys.modules.get("mpi4py.MPI")
        return next((n for n in _MPI_NAMES if getattr(mpi, n, None) is op), None)
    name = getattr(getattr(op, "op", op), "name", None)
    return name if isinstance(name, str) else None


def as_op(op: object) -> ReduceOp:
    """``op`` as a :class:`ReduceOp`: ours, one of our values (a plain int), or a foreign op translated
    by name (torch's ``ReduceOp``, mpi4py's ``MPI.Op``), never by its number, which means another op."""
    if type(op) is ReduceOp:
        return op
    if type(op) is int or (isinstance(op, np.integer) and not isinstance(op, np.bool_)):
        try:
            return ReduceOp(int(op))
        except ValueError:
            pass
    else:
        name = _name_of(op)
        if name in _BY_NAME:
            return _BY_NAME[name]
        if name is not None:
            raise TypeError(f"reduce op {name} ({op!r}) has no element-wise equivalent here; use one of "
                            f"{', '.join(ReduceOp.__members__)}")
    raise TypeError(f"unknown reduce op {op!r}; use one of {', '.join(o.name for o in ReduceOp)}")


def check_op(op: object, dtype: np.dtype) -> ReduceOp:
    """Return ``op`` as a :class:`ReduceOp` (:func:`as_op`), or raise ``TypeError`` if it makes no sense
    for ``dtype``."""
    op = as_op(op)
    if op not in allowed_ops(dtype):
        ok = ", ".join(o.name for o in sorted(allowed_ops(dtype)))
        raise TypeError(f"ReduceOp.{op.name} is not defined for dtype {np.dtype(dtype)}; it supports {ok}")
    return op


class _Ordered:
    """MIN or MAX on floats whatever the operands' order, so every rank gets the same bits: ``np.minimum``
    returns either operand of a -0/+0 tie and whichever NaN it meets. Here MIN of -0 and +0 is -0 and
    MAX is +0, and a NaN is ``np.nan`` (positive, quiet, no payload). Without zeros in ``b`` or NaNs in
    the result the fix-up is one pass looking for each; sign bits are fixed without branches, as zeros
    are common (ReLU) and a masked store on a random mask is slow."""

    __slots__ = ("ufunc", "signed")

    def __init__(self, ufunc: np.ufunc, signed: np.ufunc):
        self.ufunc, self.signed = ufunc, signed  # signed: a tie of zeros' sign bit, from the operands'

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        flip = np.equal(b, 0)
        tie = flip.any()
        if tie:  # read the signs before ``out``, which may be ``a`` or ``b``, is written
            sign = self.signed(np.signbit(a), np.signbit(b))
        out = self.ufunc(a, b, out=out)
        if tie:  # where b and the result are zeros (a was a zero, or b won): flip the signs that differ
            np.logical_and(flip, np.equal(out, 0), out=flip)
            np.logical_and(flip, np.not_equal(np.signbit(out), sign), out=flip)
            if out.itemsize <= 8:
                bits = out.view(f"u{out.itemsize}")
                bits ^= np.left_shift(flip, 8 * out.itemsize - 1, dtype=bits.dtype)
            else:  # a long double's sign is not its item's top bit (x87's 80 bits in 16 bytes)
                np.negative(out, out=out, where=flip)
        nan = np.isnan(out)
        if nan.any():
            np.putmask(out, nan, np.nan)
        return out


_FLOAT_ORDERED = {
    ReduceOp.MIN: _Ordered(np.minimum, np.logical_or),  # -0 if either is -0
    ReduceOp.MAX: _Ordered(np.maximum, np.logical_and),  # -0 only if both are
}


def kernel(op: ReduceOp, dtype: np.dtype) -> Callable[..., np.ndarray]:
    """The in-place ufunc that combines two contributions of ``dtype`` for ``op`` (AVG combines as SUM):
    ``kernel(op, dtype)(a, b, out=a)``. MIN and MAX on floats give the same bits in any operand order."""
    op, dtype = ReduceOp(op), np.dtype(dtype)
    if op in _FLOAT_ORDERED and (dtype.kind == "f" or dtype.name == "bfloat16"):
        return _FLOAT_ORDERED[op]
    return _UFUNCS[op]


def reduce_into(op: ReduceOp, acc: np.ndarray, incoming: np.ndarray, out: np.ndarray | None = None) -> None:
    """``out = acc (op) incoming`` element-wise, with ``out`` defaulting to ``acc`` (no allocation)."""
    kernel(op, acc.dtype)(acc, incoming, out=acc if out is None else out)


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
