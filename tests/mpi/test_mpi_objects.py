"""allreduce.MPI's object methods, point-to-point matching and communicators, on 1 to 4 forked ranks.

The expected values follow mpi4py's conventions: reductions apply the op in rank order, ``exscan``
gives ``None`` on rank 0, ``Split`` orders by key then rank, receives match by source and tag in
the order they were posted, and messages from one sender never overtake each other.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from support.harness import run_ranks

SIZES = [1, 2, 3, 4]


def thing(rank: int):
    return {"rank": rank, "payload": "y" * (rank * 777), "nested": [rank, (rank, None)]}


def object_methods(rank, size):
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    concat = MPI.Op.Create(lambda a, b, datatype: a + b, commute=False)  # mpi4py calls it with datatype None
    got = {
        "size": (comm.Get_rank(), comm.Get_size(), comm.rank, comm.size),
        "bcast": [comm.bcast(thing(rank), root=r) for r in range(size)],
        "gather": [comm.gather(thing(rank), root=r) for r in range(size)],
        "scatter": [comm.scatter([thing(10 * r + j) for j in range(size)] if rank == r else "ignored", root=r)
                    for r in range(size)],
        "allgather": comm.allgather(thing(rank)),
        "alltoall": comm.alltoall([(rank, j, "z" * j) for j in range(size)]),
        "allreduce": [comm.allreduce(rank + 1, op=MPI.SUM), comm.allreduce([rank], op=concat),
                      comm.allreduce((rank % 2, rank), op=MPI.MAXLOC), comm.allreduce((rank % 2, rank), op=MPI.MINLOC),
                      comm.allreduce(rank, op=MPI.MAX), comm.allreduce(rank % 2, op=MPI.LXOR)],
        "reduce": comm.reduce(str(rank), op=MPI.SUM, root=size - 1),
        "scan": comm.scan(str(rank), op=MPI.SUM),
        "exscan": comm.exscan(rank + 1, op=MPI.PROD),
    }
    comm.barrier()
    return got


@pytest.mark.parametrize("size", SIZES)
def test_object_methods_follow_mpi4py(size):
    order = "".join(str(r) for r in range(size))
    for rank, got in enumerate(run_ranks(object_methods, size)):
        assert got["size"] == (rank, size, rank, size)
        assert got["bcast"] == [thing(r) for r in range(size)]
        assert got["gather"] == [[thing(q) for q in range(size)] if r == rank else None for r in range(size)]
        assert got["scatter"] == [thing(10 * r + rank) for r in range(size)]
        assert got["allgather"] == [thing(r) for r in range(size)]
        assert got["alltoall"] == [(r, rank, "z" * rank) for r in range(size)]
        odd = size > 1
        assert got["allreduce"] == [size * (size + 1) // 2, list(range(size)), (int(odd), 1 if odd else 0), (0, 0),
                                    size - 1,
                                    functools.reduce(lambda a, b: bool(a) != bool(b), [r % 2 for r in range(size)])]
        assert got["reduce"] == (order if rank == size - 1 else None)
        assert got["scan"] == order[:rank + 1]
        assert got["exscan"] == (None if rank == 0 else functools.reduce(lambda a, b: a * b, range(1, rank + 1)))


def matching(rank, size):
    """Tags matched out of order, ANY_SOURCE, posted-order matching, probes, PROC_NULL and large messages."""
    from allreduce import MPI

    comm, got = MPI.COMM_WORLD, {}
    right, left = (rank + 1) % size, (rank - 1) % size
    comm.send("first", dest=right, tag=1)
    comm.send("second", dest=right, tag=2)
    got["by tag"] = [comm.recv(source=left, tag=2), comm.recv(source=left, tag=1)]
    comm.send("a", dest=right, tag=5)
    comm.send("b", dest=right, tag=6)
    early, late = comm.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG), comm.irecv(source=left, tag=MPI.ANY_TAG)
    got["posted order"] = [late.wait(), early.wait()]
    status = MPI.Status()
    got["iprobe nothing"] = comm.Iprobe(source=MPI.ANY_SOURCE, tag=98)  # a tag nobody sends
    comm.send(np.arange(3), dest=right, tag=99)
    comm.Probe(source=left, tag=99, status=status)
    got["probe"] = (status.Get_source(), status.Get_tag(), comm.recv(source=left, tag=99).tolist())
    if rank:
        comm.send(rank, dest=0, tag=7)
    if rank == 0:
        statuses = [MPI.Status() for _ in range(size - 1)]
        values = [comm.recv(source=MPI.ANY_SOURCE, tag=7, status=s) for s in statuses]
        got["any source"] = sorted(zip(values, (s.Get_source() for s in statuses)))
    comm.send("nowhere", dest=MPI.PROC_NULL)
    got["proc null"] = comm.recv(source=MPI.PROC_NULL)
    big = np.full(3 << 20, rank, np.uint8)  # more than socket buffers hold: sends must not wait for receives
    out = np.zeros_like(big)
    requests = [comm.Isend(big, dest=right, tag=8), comm.Irecv(out, source=left, tag=8)]
    flag = MPI.Request.Testall(requests)
    MPI.Request.Waitall(requests)
    got["big"] = (bool(np.all(out == left)), isinstance(flag, bool))
    request = comm.isend({"k": rank}, dest=right)
    got["test"] = (request.test(), comm.irecv(source=left).wait())
    return got


@pytest.mark.parametrize("size", SIZES)
def test_point_to_point_matches_like_mpi(size):
    for rank, got in enumerate(run_ranks(matching, size)):
        left = (rank - 1) % size
        assert got["by tag"] == ["second", "first"]
        assert got["posted order"] == ["b", "a"]
        assert got["iprobe nothing"] is False
        assert got["probe"] == (left, 99, [0, 1, 2])
        if rank == 0:
            assert got["any source"] == [(r, r) for r in range(1, size)]
        assert got["proc null"] is None
        assert got["big"] == (True, True)
        assert got["test"] == ((True, None), {"k": left})


def communicators(rank, size):
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    got = {}
    sub = comm.Split(color=rank % 2, key=-rank)
    got["split"] = (sub.Get_rank(), sub.Get_size(), sub.allgather(rank))
    tied = comm.Split(color=0, key=7)  # equal keys: rank order
    got["tied"] = tied.allgather(rank)
    inner = sub.Split(color=0, key=sub.rank)
    got["nested"] = inner.allreduce(rank)
    dup = sub.Dup()
    dup.send("on dup", dest=dup.rank, tag=0)
    sub.send("on sub", dest=sub.rank, tag=0)
    got["dup isolated"] = (sub.recv(source=sub.rank, tag=0), dup.recv(source=dup.rank, tag=0))
    none = comm.Split(color=MPI.UNDEFINED if rank == 0 else 3)
    got["undefined"] = none == MPI.COMM_NULL, bool(none)
    for c in (dup, inner, sub, tied):
        c.Free()
    try:
        sub.Barrier()
    except MPI.Exception as exc:  # as in mpi4py: the error class says which argument was wrong
        got["freed"] = exc.Get_error_class() == MPI.ERR_COMM, str(exc)
    try:
        comm.Free()
    except MPI.Exception as exc:
        got["world free"] = exc.Get_error_class() == MPI.ERR_COMM, str(exc)
    return got


@pytest.mark.parametrize("size", [1, 3, 4])
def test_split_orders_by_key_then_rank_and_dup_is_separate(size):
    for rank, got in enumerate(run_ranks(communicators, size)):
        same_color = [r for r in range(size) if r % 2 == rank % 2][::-1]  # key = -rank
        assert got["split"] == (same_color.index(rank), len(same_color), same_color)
        assert got["tied"] == list(range(size))
        assert got["nested"] == sum(same_color)
        assert got["dup isolated"] == ("on sub", "on dup")
        assert got["undefined"] == ((True, False) if rank == 0 else (False, True))
        assert got["freed"][0] and "COMM_NULL (or was freed)" in got["freed"][1]
        assert got["world free"][0] and "COMM_WORLD cannot be freed" in got["world free"][1]


def lonely_receive(rank, size):
    from allreduce import MPI

    MPI.COMM_WORLD.recv(source=1 - rank, tag=4)


def test_a_receive_nobody_sends_times_out_naming_it():
    """The first rank to time out names its receive; the other times out too, or hears of it first."""
    results = run_ranks(lonely_receive, 2, timeout=1.0, expect_errors=True)
    assert "CommTimeout" in [kind for _, kind, _ in results]
    for rank, (status, kind, message) in enumerate(results):
        assert status == "error" and kind in ("CommTimeout", "PeerLost"), results
        assert f"rank {rank}/2: recv #1 from rank {1 - rank} (tag 4)" in message, message
        assert "timed out after 1s waiting for a matching send from rank" in message, message
