"""Point-to-point on forked ranks and real sockets: any posting order, tags, any source, MPI's
non-overtaking rule, sizes, errors, and no waiting behind collectives (or they behind it)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import allreduce as dist
from allreduce.p2p import EAGER_MAX, WINDOW
from support.harness import run_ranks

PRIME = 7919
SIZES = [0, 1, PRIME, EAGER_MAX // 4 + 1, 16 << 20]  # int32s: empty, eager, announced (rendezvous), 64 MiB


def filled(n: int, rank: int, salt: int = 0) -> np.ndarray:
    """Distinct int32s for each rank and salt (wrapping around is fine: both sides compute the same)."""
    x = np.arange(n, dtype=np.int32)
    x *= 7
    x += rank * 1000 + salt
    return x


# ---- any order ---------------------------------------------------------------------------------

def _crossed(rank, size):
    """Both ranks post their receive before their send, then the reverse, both directions at once."""
    other, ok = 1 - rank, []
    for n in SIZES:
        for receive_first in (True, False):
            mine, theirs = filled(n, rank, n), np.zeros(n, np.int32)
            if receive_first:
                got = dist.irecv(theirs, other)
                sent = dist.isend(mine, other)
            else:
                sent = dist.isend(mine, other)
                got = dist.irecv(theirs, other)
            sent.wait()
            got.wait()
            ok.append((n, receive_first, np.array_equal(theirs, filled(n, other, n)), got.source))
    return ok


def _crossed_over_the_link(rank, size):
    """The same where ranks cannot read each other's memory: announced payloads travel over the socket."""
    from allreduce.transport import cma

    cma.readable = lambda pid, address, expected: False
    return _crossed(rank, size)


@pytest.mark.parametrize("body", [_crossed, _crossed_over_the_link], ids=["read-from-sender", "over-the-link"])
def test_receives_posted_before_sends_complete_in_both_directions(body):
    for rank, results in enumerate(run_ranks(body, 2, timeout=30)):
        for n, receive_first, equal, source in results:
            assert equal and source == 1 - rank, (n, receive_first)


def _one_side_first(rank, size):
    """Only rank 0 posts its receive first (torch's irecv-then-isend); rank 1 sends, then receives."""
    x = np.zeros(4, np.float32)
    if rank == 0:
        got = dist.irecv(x, 1)
        dist.isend(np.full(4, 5.0, np.float32), 1).wait()
        got.wait()
    else:
        dist.isend(np.full(4, 7.0, np.float32), 0).wait()
        dist.recv(x, 0)
    return x.tolist()


def test_irecv_then_isend_finishes_at_once():
    start = time.monotonic()
    assert run_ranks(_one_side_first, 2, timeout=30) == [[7.0] * 4, [5.0] * 4]
    assert time.monotonic() - start < 20  # nowhere near the timeout


def _ring(rank, size):
    """Every rank posts all its receives first (from both neighbours), then its sends."""
    left, right = (rank - 1) % size, (rank + 1) % size
    n = EAGER_MAX  # a mix of eager and announced below
    bufs = {(peer, k): np.zeros(n * (k + 1) // 2, np.int32) for peer in (left, right) for k in range(3)}
    receives = [dist.irecv(buf, peer, tag=k) for (peer, k), buf in bufs.items()]
    sends = [dist.isend(filled(n * (k + 1) // 2, rank, k), peer, tag=k) for peer in (left, right) for k in range(3)]
    for work in receives + sends:
        work.wait()
    return all(np.array_equal(buf, filled(buf.size, peer, k)) for (peer, k), buf in bufs.items())


@pytest.mark.parametrize("size", [3, 4])
def test_a_ring_with_all_receives_posted_first(size):
    assert run_ranks(_ring, size, timeout=30) == [True] * size


# ---- tags, order, any source ---------------------------------------------------------------------

def _tags(rank, size):
    """Rank 0 sends one message per tag; rank 1 receives them in the reverse tag order."""
    tags = list(range(40))
    if rank == 0:
        sends = [dist.isend(np.full(3 + t, t, np.int64), 1, tag=t) for t in tags]
        for s in sends:
            s.wait()
        announced = [dist.isend(np.full(EAGER_MAX // 4 + 1, t, np.int32), 1, tag=t) for t in (100, 101, 102)]
        for s in announced:  # their payloads move as rank 1 posts the receives, in the other order
            s.wait()
        return None
    got = []
    for t in reversed(tags):
        x = np.zeros(3 + t, np.int64)
        dist.recv(x, 0, tag=t)
        got.append(bool(np.all(x == t)))
    for t in (102, 101, 100):
        x = np.zeros(EAGER_MAX // 4 + 1, np.int32)
        dist.recv(x, 0, tag=t)
        got.append(bool(np.all(x == t)))
    return got


def test_tags_match_whatever_order_they_are_received_in():
    assert run_ranks(_tags, 2, timeout=30)[1] == [True] * 43


def _non_overtaking(rank, size):
    """Many messages with one tag, eager and announced mixed: received in the order sent."""
    count = 60
    lengths = [(i * 7919) % (3 * EAGER_MAX) for i in range(count)]
    if rank == 0:
        works = [dist.isend(np.full(lengths[i], i, np.int16), 1, tag=3) for i in range(count)]
        for w in works:
            w.wait()
        return None
    order = []
    receives = []
    for i in range(count):
        buf = np.zeros(lengths[i], np.int16)
        receives.append((buf, dist.irecv(buf, 0, tag=3)))
        if i % 5 == 4:
            time.sleep(0.001)  # some receives find their message already there, some wait for it
    for i, (buf, work) in enumerate(receives):
        work.wait()
        order.append(bool(np.all(buf == i)))
    return order


def test_messages_with_one_tag_never_overtake_each_other():
    assert run_ranks(_non_overtaking, 2, timeout=30)[1] == [True] * 60


def _flood(rank, size):
    """More small messages than the eager window, unexpected, then one the receiver takes first:
    the sender switches to announced messages, so memory stays bounded and nothing deadlocks."""
    count = 3 * WINDOW // 2048  # 1.5 windows of 1 KiB messages
    if rank == 0:
        works = [dist.isend(np.full(1024 // 8, i, np.int64), 1, tag=1) for i in range(count)]
        dist.send(np.array([42], np.int64), 1, tag=2)
        for w in works:
            w.wait()
        return None
    time.sleep(0.3)  # let the flood arrive unreceived
    first = np.zeros(1, np.int64)
    dist.recv(first, 0, tag=2)
    ok = first[0] == 42
    x = np.zeros(1024 // 8, np.int64)
    for i in range(count):
        dist.recv(x, 0, tag=1)
        ok = ok and bool(np.all(x == i))
    return ok


def test_more_unexpected_messages_than_the_eager_window():
    assert run_ranks(_flood, 2, timeout=60)[1] is True


def _any_source(rank, size):
    if rank != 0:
        dist.send(np.full(5, rank, np.int32), 0, tag=9)
        x = np.zeros(2, np.int32)
        work = dist.irecv(x)  # from any rank: only rank 0 sends to it
        work.wait()
        return work.source, x.tolist()
    senders = []
    for _ in range(size - 1):
        x = np.zeros(5, np.int32)
        source = dist.recv(x, tag=9)
        senders.append((source, bool(np.all(x == source))))
    for peer in range(1, size):
        dist.send(np.array([peer, 0], np.int32), peer)
    return sorted(senders)


@pytest.mark.parametrize("size", [3, 4])
def test_a_receive_from_any_source_reports_the_sender(size):
    results = run_ranks(_any_source, size, timeout=30)
    assert results[0] == [(r, True) for r in range(1, size)]
    for rank in range(1, size):
        assert results[rank] == (0, [rank, 0])


# ---- with collectives ----------------------------------------------------------------------------

def _interleaved(rank, size):
    """Point-to-point in flight across collectives, both ways round: nothing waits for the other."""
    big = 1 << 20  # announced: its payload moves only once the receive is posted
    x = np.ones(8, np.float32)
    if rank == 0:
        sent = dist.isend(filled(big, 0), 1, tag=1)  # rank 1 posts its receive after the all-reduce
        dist.all_reduce(x)
        sent.wait()
        got = np.zeros(big, np.int32)
        receiving = dist.irecv(got, 1, tag=2)  # rank 1 sends it after the barrier
        dist.barrier()
        receiving.wait()
        dist.all_reduce(x)
        return float(x[0]), bool(np.array_equal(got, filled(big, 1)))
    dist.all_reduce(x)
    got = np.zeros(big, np.int32)
    dist.recv(got, 0, tag=1)
    dist.barrier()
    dist.send(filled(big, 1), 0, tag=2)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    return float(x[0]), bool(np.array_equal(got, filled(big, 0)))


def test_point_to_point_and_collectives_never_wait_for_each_other():
    assert run_ranks(_interleaved, 2, timeout=20) == [(4.0, True), (4.0, True)]


def _late(rank, size):
    x = np.zeros(4, np.float32)
    if rank == 1:
        time.sleep(1.0)
        dist.send(x, 0)
        return None
    cpu = time.process_time()
    dist.recv(x, 1)
    return time.process_time() - cpu


def test_waiting_for_a_message_does_not_burn_a_core():
    waited = run_ranks(_late, 2)[0]
    assert waited < 0.3, f"rank 0 used {waited:.2f} s of CPU waiting 1 s for rank 1"


# ---- arguments and errors --------------------------------------------------------------------------

def _bad_arguments(rank, size):
    x = np.zeros(2, np.float32)
    errors = []
    for call in (lambda: dist.isend(x, rank), lambda: dist.irecv(x, 5), lambda: dist.isend(x, 1 - rank, tag=-1),
                 lambda: dist.isend(x, 1 - rank, tag=1 << 31)):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_bad_arguments_raise_before_anything_is_sent():
    for errors in run_ranks(_bad_arguments, 2):
        assert len(errors) == 4
        assert "is this rank" in errors[0] and "src=5" in errors[1] and "tag=-1" in errors[2]


def _mismatched(kind):
    def body(rank, size):
        try:
            if rank == 0:
                x = np.zeros(10, np.float32 if kind == "dtype" else np.float64)
                dist.send(np.ones(10, np.float64), 1)
                dist.recv(x, 1)  # rank 1 fails before it sends: this hears of it
            else:
                x = np.zeros(11 if kind == "count" else 10, np.float32 if kind == "dtype" else np.float64)
                dist.recv(x, 0)
                dist.send(x, 0)
        except dist.AllreduceError as exc:
            return type(exc).__name__, str(exc)
        return None
    return body


@pytest.mark.parametrize("kind", ["count", "dtype"])
def test_a_receive_of_another_size_or_dtype_is_a_mismatch(kind):
    results = run_ranks(_mismatched(kind), 2, timeout=10)
    name, message = results[1]
    assert name == "Mismatch"
    expected = "11 x float64" if kind == "count" else "10 x float32"
    assert f"rank 1/2: recv #1 from rank 0 (tag 0) expects {expected} but rank 0 sent 10 x float64" in message
    assert results[0][0] in ("PeerLost", "Mismatch") and "Mismatch" in results[0][1], results[0]


def _sender_dies(after_exchange: bool):
    def body(rank, size):
        x = np.zeros(4, np.float32)
        if after_exchange:
            dist.recv(x, 1 - rank) if rank else dist.send(x, 1)
            dist.send(x, 0) if rank else dist.recv(x, 1)
        if rank == 1:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        try:
            dist.recv(x, 1)
        except dist.AllreduceError as exc:
            return time.monotonic() - start, type(exc).__name__, str(exc)
        return None
    return body


@pytest.mark.parametrize("after_exchange", [True, False], ids=["linked", "not-yet-linked"])
def test_a_dead_peer_fails_a_receive_within_two_seconds(after_exchange):
    results = run_ranks(_sender_dies(after_exchange), 2, timeout=60, expect_errors=True)
    assert results[1] == ("killed", -signal.SIGKILL)
    elapsed, kind, message = results[0]
    assert elapsed < 2.0 and kind == "PeerLost", results[0]
    assert "rank 0/2: recv #" in message and "from rank 1 (tag 0)" in message and "rank 1" in message


def _deadline(rank, size):
    if rank == 1:
        time.sleep(2.0)  # alive, and sends nothing
        return None
    x = np.zeros(3, np.float32)
    start = time.monotonic()
    try:
        dist.recv(x, 1, tag=6)
    except dist.CommTimeout as exc:
        return time.monotonic() - start, str(exc)
    return None


def test_a_receive_nobody_sends_times_out_naming_the_peer_and_tag():
    results = run_ranks(_deadline, 2, timeout=1.0, expect_errors=True)
    elapsed, message = results[0]
    assert 0.9 < elapsed < 5, elapsed
    assert message.startswith("rank 0/2: recv #1 from rank 1 (tag 6) timed out after 1s waiting for a matching "
                              "send from rank 1"), message


def _announced_deadline(rank, size):
    if rank == 1:
        time.sleep(2.0)  # alive, and receives nothing
        return None
    try:
        dist.send(np.zeros(1 << 20, np.uint8), 1, tag=2)
    except dist.CommTimeout as exc:
        return str(exc)
    return None


def test_a_large_send_nobody_receives_times_out_naming_the_peer():
    message = run_ranks(_announced_deadline, 2, timeout=1.0, expect_errors=True)[0]
    assert message.startswith("rank 0/2: send #1 to rank 1 (tag 2) timed out after 1s waiting for rank 1 to post a "
                              "matching receive"), message


def _broken_then(rank, size):
    """After a point-to-point failure the group is broken for collectives too, and says why."""
    x = np.zeros(1, np.float32)
    if rank == 0:
        try:
            dist.recv(x, 1, tag=1)
        except dist.CommTimeout:
            pass
    else:
        time.sleep(1.5)
    try:
        dist.all_reduce(x)
    except dist.AllreduceError as exc:
        return type(exc).__name__, str(exc)
    return None


def test_a_failed_receive_breaks_the_group():
    results = run_ranks(_broken_then, 2, timeout=0.5, expect_errors=True)
    kind, message = results[0]
    assert kind == "GroupBroken" and "recv #1 from rank 1 (tag 1) timed out" in message, results[0]
    assert results[1][0] in ("GroupBroken", "PeerLost", "CommTimeout"), results[1]


def _destroyed(rank, size):
    work = dist.irecv(np.zeros(1, np.float32), 1 - rank, tag=77)  # nobody sends it
    dist.barrier()
    dist.destroy_process_group()
    try:
        work.wait()
    except dist.AllreduceError as exc:
        return str(exc)
    return None


def test_destroying_the_group_fails_what_is_pending():
    """Each rank's receive fails: its own group was destroyed, or the peer's first (its links closed)."""
    for rank, message in enumerate(run_ranks(_destroyed, 2, timeout=10)):
        assert message.startswith(f"rank {rank}/2: recv #1 from rank {1 - rank} (tag 77)"), message
        assert message.endswith(("cannot finish: process group 'default' was destroyed",
                                 f"connection to rank {1 - rank} closed: it exited, crashed or aborted")), message


# ---- a subgroup ----------------------------------------------------------------------------------

def _subgroup(rank, size):
    group = dist.new_group([1, 2])
    if rank == 0:
        return None
    x = np.full(3, rank, np.int32)
    y = np.zeros(3, np.int32)
    peer = 1 - dist.get_rank(group)  # ranks in the group
    got = dist.irecv(y, peer, group=group)
    dist.isend(x, peer, group=group).wait()
    got.wait()
    return got.source, y.tolist()


def test_ranks_are_ranks_of_the_group():
    assert run_ranks(_subgroup, 3, timeout=20) == [None, (1, [2] * 3), (0, [1] * 3)]
