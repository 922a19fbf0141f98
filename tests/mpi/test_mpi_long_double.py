"""MPI's long double types: LONG_DOUBLE, its complexes and the LONG_DOUBLE_INT pair are real datatypes
(numpy's ``longdouble``, ``clongdouble``, C's ``struct {long double; int}``), named and typecoded as
mpi4py names them, and move through point-to-point and collectives on 1 to 3 forked ranks with the
precision a double would lose, checked against numpy here."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce import MPI
from support.harness import run_ranks

pytestmark = pytest.mark.skipif(np.dtype(np.longdouble) == np.dtype(np.float64), reason="long double is double here")

FINE = 2.0 ** -56  # lost by a double next to small integers, kept by a long double
PAIR = np.dtype([("value", np.longdouble), ("index", np.intc)], align=True)


def test_long_doubles_are_named_typecoded_datatypes():
    g, G = np.dtype(np.longdouble), np.dtype(np.clongdouble)
    assert MPI.LONG_DOUBLE and MPI.LONG_DOUBLE.Get_name() == "MPI_LONG_DOUBLE"
    assert (MPI.LONG_DOUBLE.size, MPI.LONG_DOUBLE.extent) == (g.itemsize, g.itemsize)
    for complex_type in (MPI.C_LONG_DOUBLE_COMPLEX, MPI.LONG_DOUBLE_COMPLEX, MPI.CXX_LONG_DOUBLE_COMPLEX):
        assert complex_type.size == G.itemsize and complex_type.tocode() == "G" and complex_type.is_predefined
    assert MPI.LONG_DOUBLE.tocode() == "g" and MPI._typecode(MPI.LONG_DOUBLE) == "g"
    assert MPI.Datatype.fromcode("g") == MPI.LONG_DOUBLE and MPI.Datatype.fromcode(f"f{g.itemsize}") == MPI.LONG_DOUBLE
    assert MPI.Datatype.fromcode("G") == MPI.C_LONG_DOUBLE_COMPLEX
    assert MPI._typealign(MPI.LONG_DOUBLE) == g.alignment
    assert MPI.LONG_DOUBLE != MPI.DOUBLE and MPI.C_LONG_DOUBLE_COMPLEX != MPI.CXX_LONG_DOUBLE_COMPLEX


def test_long_double_int_is_cs_struct_and_the_value_index_pair():
    pair = MPI.LONG_DOUBLE_INT
    assert pair and pair.Get_name() == "MPI_LONG_DOUBLE_INT" and pair.is_named
    assert MPI.Datatype.Get_value_index(MPI.LONG_DOUBLE, MPI.INT) == pair
    assert pair.size == np.dtype(np.longdouble).itemsize + np.dtype(np.intc).itemsize
    assert pair.extent == PAIR.itemsize and MPI._typealign(pair) == PAIR.alignment
    assert MPI._typecode(pair) is None and pair.typestr == f"V{PAIR.itemsize}"


def long_doubles_between_ranks(rank, size):
    """Each way long doubles move, with values whose last bits a double would drop; what arrived."""
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    mine = np.arange(7, dtype=np.longdouble) + np.longdouble(FINE) * (rank + 1)
    got = {}
    received = np.zeros(7, np.longdouble)
    comm.Sendrecv([mine, MPI.LONG_DOUBLE], (rank + 1) % size, 5, [received, MPI.LONG_DOUBLE], (rank - 1) % size, 5)
    got["ring"] = received
    halves = np.arange(7, dtype=np.longdouble) + np.longdouble(0.5) * (rank + 1)  # products exact in any order
    for name in ("SUM", "MIN", "MAX", "PROD"):
        out = np.zeros(7, np.longdouble)
        comm.Allreduce(halves if name == "PROD" else mine, out, getattr(MPI, name))
        got[name] = out
    waves = (mine + 1j * mine[::-1]).astype(np.clongdouble)
    total = np.zeros(7, np.clongdouble)
    comm.Allreduce([waves, MPI.C_LONG_DOUBLE_COMPLEX], [total, MPI.C_LONG_DOUBLE_COMPLEX], MPI.SUM)
    got["complex"] = total
    everyone = np.zeros(7 * size, np.longdouble)
    comm.Allgather(mine, everyone)
    got["allgather"] = everyone
    prefix = np.zeros(7, np.longdouble)
    comm.Scan(mine, prefix, MPI.SUM)
    got["scan"] = prefix
    pairs = np.zeros(3, PAIR)
    if rank == size - 1:
        pairs["value"], pairs["index"] = mine[:3], [10, 20, 30]
    comm.Bcast([pairs, MPI.LONG_DOUBLE_INT], root=size - 1)
    got["pairs"] = (pairs["value"].copy(), pairs["index"].copy())
    return got


@pytest.mark.parametrize("size", [1, 2, 3])
def test_long_doubles_between_ranks_keep_their_precision(size):
    inputs = [np.arange(7, dtype=np.longdouble) + np.longdouble(FINE) * (r + 1) for r in range(size)]
    halves = [np.arange(7, dtype=np.longdouble) + np.longdouble(0.5) * (r + 1) for r in range(size)]
    want = {"SUM": np.sum(inputs, axis=0), "MIN": np.min(inputs, axis=0), "MAX": np.max(inputs, axis=0),
            "PROD": np.prod(halves, axis=0)}
    assert (want["SUM"] != want["SUM"].astype(np.float64).astype(np.longdouble)).any()  # a double would differ
    waves = [(x + 1j * x[::-1]).astype(np.clongdouble) for x in inputs]
    for rank, got in enumerate(run_ranks(long_doubles_between_ranks, size)):
        assert got["ring"].dtype == np.longdouble and np.array_equal(got["ring"], inputs[(rank - 1) % size])
        for name, expected in want.items():
            assert np.array_equal(got[name], expected), name
        assert np.array_equal(got["complex"], np.sum(waves, axis=0))
        assert np.array_equal(got["allgather"], np.concatenate(inputs))
        assert np.array_equal(got["scan"], np.sum(inputs[:rank + 1], axis=0))
        values, indices = got["pairs"]
        assert np.array_equal(values, inputs[-1][:3]) and indices.tolist() == [10, 20, 30]


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_arrays_of_long_doubles_are_memory_mpi_buffers_view(dtype):
    """numpy exports them through the buffer protocol alone (no DLPack): a buffer views them in place."""
    values = np.arange(3, dtype=dtype)
    view = MPI.buffer(values)
    assert (view.address, view.nbytes) == (values.ctypes.data, values.nbytes) and not view.readonly
    view[0] = 7
    assert values.view(np.uint8)[0] == 7
    MPI.Attach_buffer(values)
    assert MPI.Detach_buffer().address == values.ctypes.data
