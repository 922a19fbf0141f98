"""allreduce.MPI's nonblocking collectives and mpi4py's argument conventions, on 1 to 3 forked ranks,
against a numpy reference: every ``I*`` returns a Request whose result matches the blocking call;
counts are per rank where mpi4py says so; ``None`` is the in-place marker; user ops fold in rank
order; a root out of range fails on every rank."""

from __future__ import annotations

import numpy as np
import pytest

from support.harness import run_ranks

COUNTS = (0, 1, 5)


def value(rank: int, count: int, salt: int = 0) -> np.ndarray:
    return (np.arange(count) + 10 * rank + salt).astype(np.int64)


def nonblocking(rank, size):
    from allreduce import MPI

    comm, wrong = MPI.COMM_WORLD.Dup(), []

    def check(name, got, expected):
        if not np.array_equal(got, expected):
            wrong.append(f"{name}: got {got.tolist()}, expected {np.asarray(expected).tolist()}")

    for count in COUNTS:
        everyone = [value(r, count) for r in range(size)]
        out = np.zeros(count, np.int64)
        requests = [comm.Iallreduce(value(rank, count), out, MPI.SUM)]
        gathered = np.zeros(count * size, np.int64)
        requests.append(comm.Iallgather(value(rank, count), gathered))
        blocks = np.concatenate([value(rank, count, j) for j in range(size)]) if count else np.zeros(0, np.int64)
        swapped = np.zeros(count * size, np.int64)
        requests.append(comm.Ialltoall(blocks, [swapped, count, MPI.INT64_T]))  # count: per rank
        requests.append(comm.Ibarrier())
        root = size - 1
        broadcast = value(rank, count) if rank == root else np.zeros(count, np.int64)
        requests.append(comm.Ibcast(broadcast, root))
        reduced = np.zeros(count, np.int64)
        requests.append(comm.Ireduce(value(rank, count), reduced, MPI.MAX, root))
        MPI.Request.Waitall(requests, statuses := [])
        assert len(statuses) == len(requests) and not any(requests)
        check("Iallreduce", out, sum(everyone) if count else out)
        check("Iallgather", gathered, np.concatenate(everyone))
        check("Ialltoall", swapped, np.concatenate([value(r, count, rank) for r in range(size)]))
        check("Ibcast", broadcast, value(root, count))
        if rank == root:
            check("Ireduce", reduced, np.maximum.reduce(everyone) if count else reduced)
        scanned = np.zeros(count, np.int64)
        comm.Iscan(value(rank, count), scanned, MPI.SUM).Wait()
        check("Iscan", scanned, sum(everyone[:rank + 1]))
        inplace = value(rank, count)
        comm.Allreduce(None, inplace, MPI.SUM)  # None: in place
        check("Allreduce(None)", inplace, sum(everyone) if count else inplace)
        # Reduce_scatter without recvcounts: each rank keeps as many as its recvbuf holds
        counts = [(r + count) % 3 for r in range(size)]
        send = np.arange(sum(counts), dtype=np.int64) * (rank + 1)
        mine = np.zeros(counts[rank], np.int64)
        comm.Ireduce_scatter(send, mine, None, MPI.SUM).Wait()
        start = sum(counts[:rank])
        total = np.arange(sum(counts), dtype=np.int64) * sum(range(1, size + 1))
        check("Ireduce_scatter", mine, total[start:start + counts[rank]])
        # Gatherv with a (counts, displs) tuple of one count and one stride for every rank
        spread = np.full(size * (count + 1), -1, np.int64)
        comm.Igatherv(value(rank, count), [spread, (count, count + 1), MPI.INT64_T] if rank == 0 else None, 0).Wait()
        if rank == 0:
            expected = np.full(size * (count + 1), -1, np.int64)
            for r in range(size):
                expected[r * (count + 1):r * (count + 1) + count] = value(r, count)
            check("Igatherv stride", spread, expected)
    ring = np.full(4, rank, np.int64)  # what goes out is what the buffer held, whenever the peer's arrives
    comm.Isendrecv_replace(ring, (rank + 1) % size, 0, (rank - 1) % size, 0).Wait()
    check("Isendrecv_replace", ring, np.full(4, (rank - 1) % size))
    comm.Free()
    return wrong


@pytest.mark.parametrize("size", [1, 2, 3])
def test_nonblocking_collectives_match_the_reference(size):
    assert run_ranks(nonblocking, size) == [[] for _ in range(size)]


def matrix(rank: int) -> np.ndarray:
    """Rank r's 2x2 matrix: products of these depend on the order (and are associative, as MPI asks)."""
    return np.array([[rank + 2, 1], [0, 1]], np.int64)


def user_ops(rank, size):
    from allreduce import MPI

    def product(invec, inoutvec, datatype):  # inout = in @ inout: a non-commutative op
        a, b = np.frombuffer(invec, np.int64).reshape(2, 2), np.frombuffer(inoutvec, np.int64).reshape(2, 2)
        inoutvec[:] = (a @ b).tobytes()
    op = MPI.Op.Create(product, commute=False)
    out, prefix = np.zeros(4, np.int64), np.zeros(4, np.int64)
    MPI.COMM_WORLD.Allreduce(matrix(rank).reshape(-1), out, op)
    MPI.COMM_WORLD.Scan(matrix(rank).reshape(-1), prefix, op)
    op.Free()
    return out.tolist(), prefix.tolist()


@pytest.mark.parametrize("size", [1, 3])
def test_user_ops_fold_in_rank_order(size):
    def ordered(ranks):
        total = np.eye(2, dtype=np.int64)
        for r in ranks:
            total = total @ matrix(r)
        return total.reshape(-1).tolist()
    for rank, (out, prefix) in enumerate(run_ranks(user_ops, size)):
        assert out == ordered(range(size)) and prefix == ordered(range(rank + 1))


def bad_root(rank, size):
    from allreduce import MPI

    got = []
    for call in (lambda: MPI.COMM_WORLD.Bcast(np.zeros(2), root=size),
                 lambda: MPI.COMM_WORLD.Gatherv(np.zeros(1), None, root=-1)):
        try:
            call()
            got.append(None)
        except MPI.Exception as exc:
            got.append(exc.Get_error_class())
    refused = []
    for call in (lambda: MPI.COMM_WORLD.Gatherv(np.zeros(1), [np.zeros(1), [5] * size] if rank == 0 else None),
                 lambda: MPI.COMM_WORLD.Alltoallv([np.zeros(size), [1] * size],
                                                  [np.zeros(size), [5 if rank == 0 else 1] * size])):
        try:  # rank 0's counts do not fit its buffer: every rank raises, none waits
            call()
            refused.append(None)
        except ValueError as exc:
            refused.append("rank 0" in str(exc) or rank == 0)
    total = np.zeros(1)
    MPI.COMM_WORLD.Allreduce(np.ones(1), total)  # the group still works
    return got, refused, total.tolist()


def test_bad_arguments_on_one_rank_fail_on_every_rank_and_the_group_goes_on():
    from allreduce import MPI
    assert run_ranks(bad_root, 2) == [([MPI.ERR_ROOT, MPI.ERR_ROOT], [True, True], [2.0])] * 2
