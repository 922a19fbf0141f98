"""Point-to-point completion: a synchronous send completes only once its receive took it, and a waiting
rank wakes as soon as its operation is done, even when the progress thread took the frame
that finished it: persistent sends and receives in a ring, Start/Wait and Startall/Waitany, many
rounds. The engine's poll cap and the group's timeout are raised far above the run's deadline, so that
a missed wake-up fails the run rather than only slowing a round by the cap."""

import numpy as np

from support.harness import run_ranks

ROUNDS = 200


def persistent_rounds(rank, size):
    from allreduce import MPI
    from allreduce.p2p import poller

    poller.POLL_CAP_S = 3600.0  # a waiter that misses its wake-up now sleeps past the test's deadline
    comm = MPI.COMM_WORLD.Dup()
    dest, source = (rank + 1) % size, (rank - 1) % size
    received = []
    for i in range(ROUNDS):
        count = i % 3
        sent, got = np.full(count, 10 * rank + count, np.int32), np.full(count + 1, -1, np.int32)
        sending, receiving = comm.Send_init(sent, dest, 7), comm.Recv_init(got, source, 7)
        if i % 2:
            MPI.Prequest.Startall([sending, receiving])
            MPI.Prequest.Waitany([sending, receiving])
            MPI.Prequest.Waitany([sending, receiving])
        else:
            sending.Start()
            receiving.Start()
            sending.Wait()
            receiving.Wait()
        sending.Free()
        receiving.Free()
        received.append(got.tolist())
    comm.Free()
    return received


def test_persistent_ring_never_waits_for_a_frame_already_taken():
    size = 2
    results = run_ranks(persistent_rounds, size, timeout=300.0, deadline=30.0)
    for rank, received in enumerate(results):
        left = (rank - 1) % size
        assert received == [[10 * left + i % 3] * (i % 3) + [-1] for i in range(ROUNDS)]


def synchronous_sends(rank, size):
    """Rank 0 starts an Issend (buffer, then object) before rank 1 posts its receive: not done until then."""
    import time

    from allreduce import MPI

    comm = MPI.COMM_WORLD
    seen = []
    if rank == 0:
        request = comm.Issend(np.arange(3, dtype=np.int64), 1, 5)
        objects = comm.issend({"n": 7}, 1, 6)
        comm.Barrier()  # rank 1 has not posted its receives yet
        time.sleep(0.2)
        seen = [request.Test(), objects.Test()]
        comm.Barrier()  # now it posts them
        request.Wait()
        objects.wait()
        comm.Ssend(np.zeros(0), 1, 8)  # empty: also waits for its receive
        return seen
    comm.Barrier()
    comm.Barrier()
    got = np.zeros(3, np.int64)
    comm.Recv(got, 0, 5)
    seen = [got.tolist(), comm.recv(source=0, tag=6)]
    comm.Recv(np.zeros(0), 0, 8)
    return seen


def test_issend_completes_only_once_its_receive_took_it():
    first, second = run_ranks(synchronous_sends, 2)
    assert first == [False, False]
    assert second == [[0, 1, 2], {"n": 7}]


def synchronous_to_itself(rank, size):
    """An Issend to this rank itself is not done while only probed, and is once received."""
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    request = comm.Issend(np.array([rank + 1.5]), rank, 4)
    status = MPI.Status()
    comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
    probed = [status.source, status.tag, request.Test()]
    got = np.zeros(1)
    comm.Recv(got, rank, 4)
    request.Wait()
    return probed + [got.tolist()]


def test_issend_to_itself_completes_once_received():
    assert run_ranks(synchronous_to_itself, 2) == [[r, 4, False, [r + 1.5]] for r in range(2)]
