"""Point-to-point moves on tests and non-blocking probes alone: a loop of ``Test`` (or ``Testall``,
``Testany``, ``Testsome``, ``Get_status``, ``Iprobe``, ``Improbe``) moves the messages itself, as
MPI's tests do, and ``Waitany``/``Waitsome`` wait in the engine's poll and end at the group's timeout.

The first tests hold every rank's point-to-point background thread (it runs a callback of ours that
waits), so messages move only if the tests move them. The others leave it free, on a fresh
communicator (new links) per round, in the shapes that stalled now and then: a loop of ``Improbe``
on one side and ``Mprobe`` on the other, persistent requests completed by ``Waitany``. There the
engine's poll cap and the group's timeout are far above the run's deadline, so that a poller that
misses its wake-up fails the run instead of only slowing it. Every shape runs at 2 and 3 ranks (a
ring: each rank sends to the next), over shared memory and TCP.
"""

import threading
import time

import numpy as np
import pytest

from allreduce.p2p import EAGER_MAX
from support.harness import run_ranks

SIZES = [0, 1, 5, 7919, EAGER_MAX // 4 + 1, (1 << 18) + 3]  # int32s: empty, eager, announced, over 1 MiB
STALL_S = 10.0  # seconds a polling loop may take before it counts as stalled (each takes milliseconds)
HOLD = 99  # the tag of the message whose callback holds the background thread
TRANSPORTS = [pytest.param({"ALLREDUCE_TRANSPORT": t}, id=t) for t in ("shm", "tcp")]


def filled(n: int, rank: int, salt: int) -> np.ndarray:
    x = np.arange(n, dtype=np.int32)
    x *= 3
    x += 1000 * rank + salt
    return x


def until(ready, what: str) -> None:
    """Call ``ready()`` until it is true; raise if that takes :data:`STALL_S` (a stall)."""
    end = time.monotonic() + STALL_S
    while not ready():
        if time.monotonic() > end:
            raise AssertionError(f"stalled: {what}")


def hold_background_thread(rank: int, size: int):
    """Make this rank's background thread run a callback that waits until the returned event is set
    (it takes the previous rank's HOLD message, which nothing else polls for); returns once every
    rank's does. The links of the ring are made first, by a blocking exchange."""
    import allreduce as dist
    from allreduce import MPI

    dest, source = (rank + 1) % size, (rank - 1) % size
    MPI.COMM_WORLD.Sendrecv(np.zeros(1, np.int32), dest, HOLD, np.zeros(1, np.int32), source, HOLD)
    running, release = threading.Event(), threading.Event()

    def park(_):
        running.set()
        release.wait(120)

    work = dist.irecv(np.zeros(1, np.int32), src=source, tag=HOLD)
    work.get_future().add_done_callback(park)
    MPI.COMM_WORLD.Barrier()  # every callback is in place before a HOLD message can arrive
    sent = dist.isend(np.zeros(1, np.int32), dst=dest, tag=HOLD)
    assert running.wait(STALL_S), "the background thread never took the HOLD message"
    MPI.COMM_WORLD.Barrier()
    return release, sent


# ---- loops of tests alone --------------------------------------------------------------------

def complete_by(form: str, requests: list, what: str) -> None:
    """Complete ``requests`` with nothing but the MPI test ``form``, in a loop."""
    from allreduce import MPI

    if form == "Test":
        pending = list(requests)
        until(lambda: swept(pending), what)
    elif form == "Testall":
        until(lambda: MPI.Request.Testall(requests), what)
    elif form == "Testany":
        until(lambda: MPI.Request.Testany(requests) == (MPI.UNDEFINED, True), what)
    elif form == "Testsome":
        until(lambda: MPI.Request.Testsome(requests) is None, what)
    elif form == "Get_status":
        until(lambda: MPI.Request.Get_status_all(requests), what)
        MPI.Request.Waitall(requests)  # done: waits for nothing
    assert not any(requests), f"{what}: left active"


def swept(pending: list) -> bool:
    """Test each of ``pending`` once, keeping those not done; whether none is left."""
    pending[:] = [request for request in pending if not request.Test()]
    return not pending


REQUEST_FORMS = ["Test", "Testall", "Testany", "Testsome", "Get_status"]
PROBE_FORMS = ["Iprobe", "Improbe"]


def only_tests_poll(rank, size):
    """Every size, with each test form, while the background threads are held."""
    from allreduce import MPI

    comm, dest, source = MPI.COMM_WORLD, (rank + 1) % size, (rank - 1) % size
    release, held = hold_background_thread(rank, size)
    results = []
    try:
        for tag, form in enumerate(REQUEST_FORMS + PROBE_FORMS):
            for n in SIZES:
                what = f"{form} of {n} int32s"
                got = np.full(n + 1, -1, np.int32)  # one more: any message that fits is taken
                sending = comm.Isend(filled(n, rank, tag), dest, tag)
                if form in REQUEST_FORMS:
                    complete_by(form, [sending, comm.Irecv(got, source, tag)], what)
                else:
                    status, found = MPI.Status(), []
                    if form == "Iprobe":
                        until(lambda: comm.Iprobe(source, tag, status), what)  # noqa: B023 - called within this iteration
                        comm.Irecv(got, source, tag).Wait()
                    else:
                        until(lambda: found.append(comm.Improbe(source, tag, status)) or found[-1], what)  # noqa: B023 - called within this iteration
                        found[-1].Irecv(got).Wait()
                    assert (status.Get_source(), status.Get_tag(), status.Get_count(MPI.INT32_T)) == (source, tag, n)
                    complete_by("Test", [sending], what)
                results.append((form, n, got[:n].tolist() == filled(n, source, tag).tolist(), int(got[n])))
    finally:
        release.set()
    held.wait()
    return results


@pytest.mark.parametrize("env", TRANSPORTS)
@pytest.mark.parametrize("size", [2, 3])
def test_loops_of_tests_move_messages_while_the_background_thread_is_held(size, env):
    for results in run_ranks(only_tests_poll, size, env=env, deadline=180):
        assert results == [(form, n, True, -1) for form in REQUEST_FORMS + PROBE_FORMS for n in SIZES]


# ---- fresh links, the background thread free ---------------------------------------------------

def improbe_against_mprobe(rank, size):
    """Per round on a new communicator: a blocking exchange (so waiting threads poll while the links are
    made), then even ranks find the next message with a loop of Improbe while odd ranks Mprobe it."""
    from allreduce import MPI
    from allreduce.p2p import poller

    poller.POLL_CAP_S = 3600.0
    dest, source, wrong = (rank + 1) % size, (rank - 1) % size, []
    for i in range(40):
        n = SIZES[i % len(SIZES)]
        comm = MPI.COMM_WORLD.Dup()
        first, second = np.full(n, -1, np.int32), np.full(n, -1, np.int32)
        sending = comm.Isend(filled(n, rank, i), dest, 0)
        comm.Mprobe(source, 0).Recv(first)
        sending.Wait()
        sending = comm.Isend(filled(n, rank, -i), dest, 1)
        if rank % 2 == 0:
            found = []
            until(lambda: found.append(comm.Improbe(source, 1)) or found[-1], f"Improbe, round {i}")  # noqa: B023 - called within this iteration
            found[-1].Irecv(second).Wait()
        else:
            comm.Mprobe(source, 1).Recv(second)
        complete_by("Test", [sending], f"round {i}")
        if first.tolist() != filled(n, source, i).tolist() or second.tolist() != filled(n, source, -i).tolist():
            wrong.append(i)
        comm.Free()
    return wrong


def persistent_rounds(rank, size):
    """Persistent sends and receives in a ring, completed by Waitany, Waitsome, Testany or Wait in turn;
    a new communicator every few rounds."""
    from allreduce import MPI
    from allreduce.p2p import poller

    poller.POLL_CAP_S = 3600.0
    dest, source, wrong = (rank + 1) % size, (rank - 1) % size, []
    comm = None
    for i in range(120):
        if i % 6 == 0:
            if comm is not None:
                comm.Free()
            comm = MPI.COMM_WORLD.Dup()
        n = SIZES[i % len(SIZES)]
        sent, got = filled(n, rank, i), np.full(n, -1, np.int32)
        requests = [comm.Send_init(sent, dest, 3), comm.Recv_init(got, source, 3)]
        MPI.Prequest.Startall(requests)
        way = i % 4
        if way == 0:
            indices = {MPI.Prequest.Waitany(requests), MPI.Prequest.Waitany(requests)}
            wrong += [] if indices == {0, 1} and MPI.Prequest.Waitany(requests) == MPI.UNDEFINED else [(i, "Waitany")]
        elif way == 1:
            done = []
            while (some := MPI.Prequest.Waitsome(requests)) is not None:
                done += some
            wrong += [] if sorted(done) == [0, 1] else [(i, "Waitsome")]
        elif way == 2:
            until(lambda: MPI.Prequest.Testany(requests) == (MPI.UNDEFINED, True), f"Testany, round {i}")  # noqa: B023 - called within this iteration
        else:
            MPI.Prequest.Waitall(requests)
        if got.tolist() != filled(n, source, i).tolist():
            wrong.append((i, "values"))
        for request in requests:
            request.Free()
    comm.Free()
    return wrong


@pytest.mark.parametrize("env", TRANSPORTS)
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("body", [improbe_against_mprobe, persistent_rounds])
def test_polling_loops_on_new_links_never_stall(body, size, env):
    assert run_ranks(body, size, timeout=300.0, deadline=120.0, env=env) == [[]] * size


# ---- every wait ends ---------------------------------------------------------------------------

def waitany_alone(rank, size):
    """Rank 0 waits for any of two receives that no send matches; rank 1 outlives the group's timeout."""
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    if rank == 1:
        time.sleep(3.0)
        return None
    requests = [comm.Irecv(np.zeros(2, np.int32), 1, 5), comm.Irecv(np.zeros(2, np.int32), 1, 6)]
    start = time.monotonic()
    try:
        MPI.Request.Waitany(requests)
    except Exception as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "returned"


def test_waitany_ends_at_the_groups_timeout_naming_the_receive():
    outcome = run_ranks(waitany_alone, 2, timeout=1.0, deadline=60.0)[0]
    name, message, waited = outcome
    assert name == "CommTimeout" and "recv #1 from rank 1 (tag 5)" in message and "timed out after 1s" in message
    assert 0.9 <= waited < 30.0


def sendrecv_tested_early(rank, size):
    """Rank 0 tests an Isendrecv with rank 1 before rank 1 sends (it waits in a barrier): not done yet,
    in every test form; then done once the message came."""
    from allreduce import MPI

    comm, other = MPI.COMM_WORLD, 1 - rank
    got = np.zeros(3, np.int32)
    if rank == 1:
        comm.Barrier()
    request = comm.Isendrecv(filled(3, rank, 0), other, 4, got, other, 4)
    early = []
    if rank == 0:
        early = [MPI.Request.Testall([request]), MPI.Request.Testany([request]) != (MPI.UNDEFINED, False),
                 MPI.Request.Testsome([request]) != [], request.Get_status(), request.Test()]
        comm.Barrier()
    MPI.Request.Waitany([request])
    return early, got.tolist() == filled(3, other, 0).tolist(), bool(request)


def test_a_sendrecv_is_not_done_before_its_message_came():
    assert run_ranks(sendrecv_tested_early, 2) == [([False] * 5, True, False), ([], True, False)]
