"""``Comm.Allreduce`` of plain 1-D arrays takes the numpy API's way (the input copied into the receive
buffer, reduced in place there, a remembered shape straight to its shortcut): checked against a numpy
reference over repeated calls, separate and ``IN_PLACE`` buffers, several dtypes, ops and counts; what
that way does not take (2-D, strided or read-only buffers, logical ops, unequal counts) still gets the
general path's results and errors."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from support.harness import run_ranks
from support.reference import make_input

COUNTS = (0, 1, 2, 7, 13, 1001)
CASES = [("float32", "SUM"), ("float64", "MAX"), ("int64", "PROD"), ("int32", "MIN"), ("uint8", "BOR"),
         ("float16", "SUM"), ("int32", "LAND")]
UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum, "BOR": np.bitwise_or,
          "LAND": np.logical_and}


def _expected(op: str, ins: list[np.ndarray]) -> np.ndarray:
    dtype = ins[0].dtype
    return functools.reduce(lambda a, b: UFUNCS[op](a, b).astype(dtype), ins)


def _allreduce_matrix(rank: int, size: int) -> list[str]:
    from allreduce import MPI

    comm, wrong = MPI.COMM_WORLD, []
    for dtype, op_name in CASES:
        op = getattr(MPI, op_name)
        for count in COUNTS:
            for call in range(3):  # the first plans the shape, the later ones take its shortcut
                ins = [make_input(dtype, count, r, salt=call) % 3 for r in range(size)]
                want = _expected(op_name, ins)
                recv = np.full(count, 99, dtype)
                comm.Allreduce(ins[rank], recv, op)
                inplace = ins[rank].copy()
                comm.Allreduce(MPI.IN_PLACE, inplace, op)
                for how, got in (("separate", recv), ("IN_PLACE", inplace)):
                    if got.dtype != want.dtype or not np.array_equal(got, want):
                        wrong.append(f"{dtype} {op_name} {count} call {call} {how}: {got[:4]} != {want[:4]}")
    grid = np.arange(6, dtype=np.float64).reshape(2, 3) + rank
    out = np.empty_like(grid)
    comm.Allreduce(grid, out)
    if not np.array_equal(out, sum(np.arange(6, dtype=np.float64).reshape(2, 3) + r for r in range(size))):
        wrong.append(f"2-D: {out}")
    strided = np.zeros(8)[::2]
    try:
        comm.Allreduce(np.ones(4), strided)
        wrong.append(f"strided receive buffer accepted: {strided}")
    except (BufferError, TypeError, ValueError, MPI.Exception):
        pass
    for bad in (np.ones(3), np.ones(5, np.float32)):
        try:
            comm.Allreduce(bad, np.empty(4))
            wrong.append(f"{bad.size} {bad.dtype} into 4 float64 accepted")
        except (BufferError, TypeError, ValueError, MPI.Exception):
            pass
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    try:
        comm.Allreduce(np.ones(2), frozen)
        wrong.append("read-only receive buffer accepted")
    except (BufferError, TypeError, ValueError, MPI.Exception):
        pass
    return wrong


@pytest.mark.parametrize("size", [1, 2, 3])
def test_allreduce_of_plain_arrays_matches_numpy(size):
    assert run_ranks(_allreduce_matrix, size, deadline=240) == [[]] * size
