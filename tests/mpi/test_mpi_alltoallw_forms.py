"""Alltoallw's buffer forms without counts, as mpi4py reads them: ``[data, types]`` and
``[data, None, None, types]`` are one element of each block's type at the start of ``data``; the
forms it refuses (other lengths, only one of counts and displs, MPI.BOTTOM without both) raise
ValueError. On 1 to 3 forked ranks, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from support.harness import run_ranks


def first_elements_to_everyone(rank, size):
    """Each rank sends the first element of its data to every rank (no counts); each receives rank j's
    into element j (explicit counts), and on COMM_SELF its own first element into a buffer without counts."""
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    data = np.arange(5, dtype=np.float64) + 10 * rank
    got = np.full(size + 1, -1.0)
    comm.Alltoallw([data, None, None, [MPI.DOUBLE] * size],
                   [got, ([1] * size, [8 * j for j in range(size)]), [MPI.DOUBLE] * size])
    alone = np.full(3, -1, np.intc)
    MPI.COMM_SELF.Alltoallw([np.array([7 + rank, 8, 9], np.intc), [MPI.INT]], [alone, [MPI.INT]])
    return got.tolist(), alone.tolist()


@pytest.mark.parametrize("size", [1, 2, 3])
def test_blocks_without_counts_are_one_element_at_the_start(size):
    for rank, (got, alone) in enumerate(run_ranks(first_elements_to_everyone, size)):
        assert got == [10.0 * j for j in range(size)] + [-1.0]
        assert alone == [7 + rank, -1, -1]


def refusals(rank, size):
    """Each malformed form on COMM_WORLD: every rank refuses it alike, so nobody waits."""
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    send, recv = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
    counts, displs, types = [1] * size, list(range(size)), [MPI.BYTE] * size
    bad = {
        "one item": ([send], [recv, counts, displs, types]),
        "five items": ([send, counts, displs, types, None], [recv, counts, displs, types]),
        "counts alone": ([send, counts, None, types], [recv, counts, displs, types]),
        "displs alone": ([send, counts, displs, types], [recv, None, displs, types]),
        "bottom without counts": ([MPI.BOTTOM, None, displs, types], [recv, counts, displs, types]),
        "bottom without displs": ([MPI.BOTTOM, counts, None, types], [recv, counts, displs, types]),
    }
    raised = {}
    for what, (smsg, rmsg) in bad.items():
        try:
            comm.Alltoallw(smsg, rmsg)
            raised[what] = None
        except Exception as exc:
            raised[what] = type(exc).__name__
    comm.Alltoallw([send + rank, counts, displs, types], [recv, counts, displs, types])  # still usable
    raised["after"] = recv.tolist()
    return raised


@pytest.mark.parametrize("size", [1, 2])
def test_malformed_forms_raise_value_error_on_every_rank(size):
    for got in run_ranks(refusals, size):
        assert got.pop("after") == list(range(size))
        assert got == dict.fromkeys(got, "ValueError")
