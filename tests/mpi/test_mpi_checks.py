"""What mpi4py refuses, refused here too: ranks whose uneven blocks have different dtypes (raw bytes would
be read as another dtype) get ``Mismatch`` on every rank, naming both dtypes; a send and a receive
buffer of different counts are refused before anything is sent."""

from __future__ import annotations

import numpy as np
import pytest

from support.harness import run_ranks

SIZE = 2


def _dtype_of(rank):
    return np.float32 if rank == 0 else np.int32


def uneven_dtypes(rank, size):
    """Each v-variant and the split all-to-all with float32 on rank 0 and int32 on rank 1: the errors."""
    import allreduce
    from allreduce import MPI

    comm, dtype, errors = MPI.COMM_WORLD, _dtype_of(rank), {}
    calls = {
        "Alltoallv": lambda: comm.Alltoallv([np.ones(size, dtype), [1] * size], [np.zeros(size, dtype), [1] * size]),
        "Allgatherv": lambda: comm.Allgatherv(np.ones(1, dtype), [np.zeros(size, dtype), [1] * size]),
        "Gatherv": lambda: comm.Gatherv(np.ones(1, dtype), [np.zeros(size, dtype), [1] * size] if rank == 0 else None),
        "Scatterv": lambda: comm.Scatterv([np.ones(size, dtype), [1] * size] if rank == 0 else None,
                                          np.zeros(1, dtype)),
        "all_to_all_single": lambda: allreduce.all_to_all_single(np.zeros(size, dtype), np.ones(size, dtype),
                                                                  [1] * size, [1] * size),
    }
    for name, call in calls.items():
        try:
            call()
            errors[name] = None
        except allreduce.Mismatch as exc:
            errors[name] = str(exc)
    # a rank's own send and receive dtypes count too: float32 sent, int32 received, on every rank
    try:
        comm.Alltoallv([np.ones(size, np.float32), [1] * size], [np.zeros(size, np.int32), [1] * size])
        errors["send and receive"] = None
    except allreduce.Mismatch as exc:
        errors["send and receive"] = str(exc)
    x = np.arange(3, dtype=np.float64) + rank  # and agreeing ranks still work
    out = np.zeros(3 * size)
    comm.Allgatherv(x, [out, [3] * size])
    return errors, out.tolist()


def test_uneven_collectives_refuse_ranks_of_different_dtypes():
    for errors, gathered in run_ranks(uneven_dtypes, SIZE):
        assert gathered == [0.0, 1.0, 2.0, 1.0, 2.0, 3.0]
        for name, message in errors.items():
            assert message is not None, name
            assert "float32" in message and "int32" in message, (name, message)


def counts(rank, size):
    import allreduce
    from allreduce import MPI

    comm, refused = MPI.COMM_WORLD, "mismatch in send count 1 and receive count 4"
    out = np.full(4, -1.0)
    with pytest.raises(ValueError, match=refused):
        comm.Allreduce(np.array([1.0 + rank]), out)
    with pytest.raises(ValueError, match=refused):
        comm.Iallreduce(np.array([1.0 + rank]), out)
    # only the root's Reduce is wrong: it refuses at once, and its next call tells rank 1, still in the
    # reduce, that the ranks differ (no wait for the timeout)
    with pytest.raises(allreduce.Mismatch, match="reduce"):
        if rank == 0:
            with pytest.raises(ValueError, match=refused):
                comm.Reduce(np.array([1.0]), out, root=0)
            comm.Barrier()
        else:
            comm.Reduce(np.array([2.0]), None, root=0)
    return out.tolist()


def test_send_and_receive_counts_must_agree():
    assert run_ranks(counts, SIZE, timeout=60, deadline=30) == [[-1.0] * 4] * SIZE
