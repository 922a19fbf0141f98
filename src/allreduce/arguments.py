"""What the public functions take, and the checks on it that they, the object collectives and
``allreduce.MPI`` share: each raises ``TypeError``/``ValueError`` naming the argument before anything
is sent, so a bad call fails on the rank that made it rather than as a mismatch on every rank.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence, Sized
from typing import TYPE_CHECKING, TypeVar, Union

import numpy as np

from .buffers import as_array
from .ops import ReduceOp, check_op
from .p2p import TAG_UB
from .settings import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    import torch

# Named so that signatures say what they take (and type checkers see it).
Tensor = Union[np.ndarray, "torch.Tensor"]  # a numpy array or a torch CPU tensor, read and written in place
Op = ReduceOp | int  # a ReduceOp, or its value; torch's and mpi4py's ops are taken by name (ops.as_op)
Timeout = float | datetime.timedelta | None  # seconds; None: the default group's, else DEFAULT_TIMEOUT
Number = int | float | complex
SizedT = TypeVar("SizedT", bound=Sized)

# (op, dtype) -> the ReduceOp check_op returned: the hot path checks each pair once
_CHECKED: dict[tuple[object, np.dtype], ReduceOp] = {}


def checked_op(op: object, dtype: np.dtype) -> ReduceOp:
    """:func:`~allreduce.ops.check_op`, remembered per (op, dtype) pair that it accepted; only our own
    ops are looked up, as a foreign one (torch's) may hash and compare equal to another of ours."""
    if type(op) is not ReduceOp:
        return check_op(op, dtype)
    try:
        return _CHECKED[op, dtype]
    except KeyError:
        checked = check_op(op, dtype)
    if len(_CHECKED) < 1024:
        _CHECKED[op, dtype] = checked
    return checked


def check_rank(rank: object, size: int, name: str, *special: int, within: str = "group") -> None:
    """``rank`` is a rank of a ``within`` of ``size`` ranks, or one of the ``special`` values (MPI's
    ``PROC_NULL``, ``ANY_SOURCE``)."""
    if not isinstance(rank, (int, np.integer)) or not (0 <= rank < size or rank in special):
        raise ValueError(f"{name}={rank!r} is not a rank of this {within} (0..{size - 1})")


def check_peer(rank: object, size: int, own: int, name: str) -> None:
    """:func:`check_rank`, and not this rank (``own``): point-to-point needs another."""
    check_rank(rank, size, name)
    if rank == own:
        raise ValueError(f"{name}={rank} is this rank; point-to-point needs another rank")


def check_tag(tag: object, wildcard: int | None = None) -> None:
    """``tag`` is a message tag in 0..TAG_UB, or ``wildcard`` (MPI's ``ANY_TAG``, where a receive takes any)."""
    if not isinstance(tag, (int, np.integer)) or not (0 <= tag <= TAG_UB or tag == wildcard):
        also = "" if wildcard is None else " or ANY_TAG"
        raise ValueError(f"tag={tag!r} must be an integer in 0..{TAG_UB}{also}")


def check_same_dtype(a: np.ndarray, b: np.ndarray) -> None:
    """The output ``a`` and the input ``b`` hold one dtype (collectives do not convert)."""
    if a.dtype != b.dtype:
        raise TypeError(f"input and output dtypes differ: {b.dtype} vs {a.dtype}")


def one_per_rank(items: SizedT | None, size: int, name: str, what: str = "tensor") -> SizedT:
    """``items``, checked to hold one ``what`` per rank of a group of ``size``."""
    if items is None or len(items) != size:
        raise ValueError(f"{name} must hold one {what} per rank ({size}), got {None if items is None else len(items)}")
    return items


def arrays_per_rank(tensors: Sequence[Tensor] | None, size: int, like: np.ndarray, name: str,
                    writable: bool = True) -> list[np.ndarray]:
    """``tensors`` as arrays: one per rank, each of ``like``'s dtype and number of elements."""
    arrays = [as_array(t, f"{name}[{i}]", writable) for i, t in enumerate(one_per_rank(tensors, size, name))]
    for i, a in enumerate(arrays):
        if a.dtype != like.dtype or a.size != like.size:
            raise ValueError(f"{name}[{i}] must match the tensor ({like.size} x {like.dtype}), "
                             f"got {a.size} x {a.dtype}")
    return arrays


def timeout_seconds(timeout: Timeout) -> float:
    """``timeout`` in seconds (``None``: DEFAULT_TIMEOUT); it must be positive."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    value = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    if value <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return value
