"""A bad argument on one rank never leaves another waiting in a collective: the rank that refuses its
arguments raises its own error at once, and every peer waiting in that call raises ``Mismatch``
naming the rank, the collective, its number and the reason, long before the group's timeout; where
every rank refuses alike, nobody waits and the communicator keeps working. At 2 and 3 ranks, over
TCP and shared memory, for each kind of even collective of allreduce.MPI and for the core API."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from allreduce.transport import shm
from support.harness import run_ranks

TIMEOUT = 30.0  # the groups' collective timeout: a waiting peer must raise well within it
PROMPT = TIMEOUT / 2


def _cases(comm, size: int, bad: bool):
    """One even collective each, called by every rank; ``bad``: this rank's arguments are refused."""
    from allreduce import MPI

    x, out = np.arange(size, dtype=np.float64), np.zeros(size * size)
    return {
        "Bcast": lambda: comm.Bcast(x, root=size if bad else 0),
        "Gather": lambda: comm.Gather([x, 99, MPI.DOUBLE] if bad else x, out, root=0),
        "Scatter": lambda: comm.Scatter(out, np.frombuffer(x.tobytes()) if bad else x.copy(), root=0),
        "Allgather": lambda: comm.Allgather(x, out[:-1] if bad else out),
        "Alltoall": lambda: comm.Alltoall([x, "\0"] if bad else x, x.copy()),
        "Allreduce": lambda: comm.Allreduce(x, np.zeros(size + bad)),
        "Iallreduce": lambda: comm.Iallreduce(x, np.zeros(size, np.float32 if bad else np.float64)).Wait(),
        "Reduce": lambda: comm.Reduce(x, x.copy(), root=-1 if bad else 0),
        "Reduce_scatter_block": lambda: comm.Reduce_scatter_block(out, np.zeros(size + bad)),
        "Scan": lambda: comm.Scan(x, np.zeros(size - bad)),
    }


def one_rank_refuses(rank, size):
    """Each case on a communicator of its own (a peer's Mismatch breaks it), the last rank refusing;
    then the core API's broadcast with a bad source on the last rank, on a group of its own."""
    import allreduce
    from allreduce import MPI

    world, seen = MPI.COMM_WORLD, {}
    bad = rank == size - 1
    for name in _cases(world, size, False):
        comm = world.Dup()
        begun = time.monotonic()
        try:
            _cases(comm, size, bad)[name]()
            seen[name] = (None, "", time.monotonic() - begun)
        except Exception as exc:
            seen[name] = (type(exc).__name__, str(exc), time.monotonic() - begun)
        world.Barrier()  # the refusing rank keeps its links open until the peers have raised
        comm.Free()
    group = allreduce.new_group(list(range(size)))
    begun = time.monotonic()
    try:
        allreduce.broadcast(np.zeros(3), src=size if bad else 0, group=group)
        seen["broadcast"] = (None, "", time.monotonic() - begun)
    except Exception as exc:
        seen["broadcast"] = (type(exc).__name__, str(exc), time.monotonic() - begun)
    world.Barrier()
    return seen


def every_rank_refuses(rank, size):
    """Every rank refuses the same calls, each followed by a good one: all raise, the good ones agree."""
    import allreduce
    from allreduce import MPI

    comm, raised, sums = MPI.COMM_WORLD, [], []
    for name, call in list(_cases(comm, size, True).items()) * 2:
        try:
            call()
        except Exception as exc:
            raised.append((name, type(exc).__name__))
        total = np.array([rank + 1.0])
        comm.Allreduce(MPI.IN_PLACE, total)
        sums.append(float(total[0]))
    try:
        allreduce.broadcast(np.zeros(3), src=size)
    except ValueError:
        raised.append(("broadcast", "ValueError"))
    got = np.full(3, float(rank))
    allreduce.broadcast(got, src=0)
    return raised, sums, got.tolist()


NEED_EVERY_RANK = {"Allgather", "Alltoall", "Allreduce", "Iallreduce", "Reduce_scatter_block", "Scan"}
TRANSPORTS = ["tcp", pytest.param("shm", marks=pytest.mark.skipif(not shm.available(), reason="no shared memory"))]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", [2, 3])
def test_a_peer_waiting_for_a_rank_that_refused_raises_mismatch_naming_it(size, transport):
    results = run_ranks(one_rank_refuses, size, timeout=TIMEOUT, deadline=240.0,
                        env={"ALLREDUCE_TRANSPORT": transport})
    refusing = size - 1
    for name, (kind, message, elapsed) in results[refusing].items():
        assert kind in ("ValueError", "TypeError", "BufferError", "KeyError", "Exception"), (name, kind, message)
        assert elapsed < PROMPT, (name, elapsed)
    for rank in range(refusing):
        for name, (kind, message, elapsed) in results[rank].items():
            assert elapsed < PROMPT, (rank, name, elapsed)
            if kind is None:  # a rank that needs nothing of the refusing one may finish (a root's sends)
                assert name not in NEED_EVERY_RANK and (rank, name) not in ((0, "Gather"), (0, "Reduce")), (rank, name)
                continue
            assert kind == "Mismatch", (rank, name, kind, message)
            called = {"Iallreduce": "Allreduce"}.get(name, name)  # the nonblocking form refuses as its blocking one
            assert f"rank {refusing} refused its arguments to {called}" in message, (rank, name, message)
            assert re.search(r"#\d+", message) and f"rank {rank}/{size}" in message, (rank, name, message)
            own = results[refusing][name][1]
            assert own.split(";")[0][:40] in message, (name, own, message)  # the reason it gave


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", [2, 3])
def test_a_call_every_rank_refuses_leaves_the_communicator_working(size, transport):
    results = run_ranks(every_rank_refuses, size, timeout=TIMEOUT, deadline=240.0,
                        env={"ALLREDUCE_TRANSPORT": transport})
    cases = len(_cases(None, size, True))
    for raised, sums, got in results:
        assert len(raised) == 2 * cases + 1 and raised == results[0][0]
        assert sums == [size * (size + 1) / 2] * (2 * cases)
        assert got == [0.0, 0.0, 0.0]
