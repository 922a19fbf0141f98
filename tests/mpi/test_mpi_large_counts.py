"""Contiguous types of more elements than a C int counts, as an MPI 3 (``Get_version``) makes them:
nothing of their size is laid out or allocated, ``size`` is exact, and ``decode`` shows a struct of
a vector of INT_MAX-element blocks and a contiguous rest, each of which rebuilds its part."""

from __future__ import annotations

import time

import pytest

from allreduce import MPI

INT_MAX = 2**31 - 1


def test_int_max_elements_stay_one_contiguous_type():
    made = MPI.BYTE.Create_contiguous(INT_MAX)
    assert made.size == made.extent == INT_MAX
    assert made.decode() == (MPI.BYTE, "CONTIGUOUS", {"count": INT_MAX})
    made.Free()


@pytest.mark.skipif(MPI.Get_version() >= (4, 0), reason="an MPI 4 counts in MPI_Count")
@pytest.mark.parametrize("old,count", [(MPI.BYTE, INT_MAX + INT_MAX // 1024), (MPI.DOUBLE, 3 * INT_MAX + 7),
                                       (MPI.INT, 2 * INT_MAX)])
def test_more_than_int_max_elements_decode_as_mpi3_builds_them(old, count):
    start = time.process_time()
    made = old.Create_contiguous(count).Commit()
    assert made.size == made.extent == count * old.size
    old_type, combiner, params = made.decode()
    assert (old_type, combiner) == (MPI.DATATYPE_NULL, "STRUCT")
    blocks, rest = params["datatypes"]
    assert params["blocklengths"] == [1, 1] and params["displacements"] == [0, blocks.size]
    assert blocks.decode() == (old, "VECTOR", {"count": count // INT_MAX, "blocklength": INT_MAX, "stride": INT_MAX})
    assert blocks.size == (count // INT_MAX) * INT_MAX * old.size
    assert rest.decode() == (old, "CONTIGUOUS", {"count": count % INT_MAX}) and rest.size == count % INT_MAX * old.size
    assert made.Get_envelope() == (3, 2, 0, 2, MPI.COMBINER_STRUCT)
    assert time.process_time() - start < 5  # nothing of the type's size was built (that would take minutes)
    for part in (blocks, rest, made):
        part.Free()
