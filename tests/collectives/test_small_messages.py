"""The small-message path (the shared-memory lines): every collective it serves, every dtype and op,
counts up to a full line, against numpy; the same bits as the left fold in rank order; async calls
mixed with blocking ones; and its failures: mismatch (on the lines, and between the lines and the
schedules) and a dead peer. (A timeout on the lines, with its stall report, is in tests/faults.)"""

from __future__ import annotations

import array
import os
import signal
import time

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks
from support.reference import all_gather_misses, left_fold_misses, make_input, reduced, same

import allreduce as dist
from allreduce.dtypes import SUPPORTED
from allreduce.ops import ReduceOp, allowed_ops
from allreduce.transport import shm

pytestmark = [pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64"),
              engines.BOTH]

SHM = {"ALLREDUCE_TRANSPORT": "shm"}
LINE = shm.ShmOptions().line_max  # bytes per rank that take the lines


def _largest_prime_at_most(n: int) -> int:
    return next(p for p in range(n, 1, -1) if all(p % d for d in range(2, int(p ** 0.5) + 1)))


def counts(dtype: np.dtype) -> list[int]:
    """Counts that break naive code, up to the largest prime that fills a line."""
    most = LINE // dtype.itemsize
    return [0, 1, 2, 7, 13, 251, _largest_prime_at_most(most)]


def _every_shape(rank, size):
    """All collectives the lines serve, each dtype x op x count; the failures, described."""
    failures = []
    for dtype in map(np.dtype, SUPPORTED):
        for op in sorted(allowed_ops(dtype)):
            for count in counts(dtype):
                x = make_input(dtype, count, rank, op)
                dist.all_reduce(x, op=op)
                want = reduced(op, [make_input(dtype, count, r, op) for r in range(size)])
                if not same(x, want):
                    failures.append(f"all_reduce {dtype} {op.name} count={count}")
        for count in (0, 5, LINE // dtype.itemsize):
            root = count % size
            x = make_input(dtype, count, rank)
            dist.broadcast(x, src=root)
            if not same(x, make_input(dtype, count, root)):
                failures.append(f"broadcast {dtype} count={count}")
            op = ReduceOp.MAX if dtype.kind != "c" else ReduceOp.SUM
            x = make_input(dtype, count, rank, op)
            dist.reduce(x, dst=root, op=op)
            want = reduced(op, [make_input(dtype, count, r, op) for r in range(size)]) if rank == root else \
                make_input(dtype, count, rank, op)
            if not same(x, want):
                failures.append(f"reduce {dtype} count={count}")
            failures += all_gather_misses(rank, size, dtype, count)
            dist.barrier()
    return failures


@pytest.mark.parametrize("size", [1, 2, 3, pytest.param(5, marks=pytest.mark.slow),
                                  pytest.param(8, marks=pytest.mark.slow)])
def test_every_collective_dtype_op_and_count_on_the_lines(size):
    assert run_ranks(_every_shape, size, timeout=60, deadline=240, env=SHM) == [[]] * size


def _at_odd_address(values: np.ndarray) -> np.ndarray:
    """``values`` copied into an array one byte past an aligned start: its items are not aligned."""
    raw = np.zeros(values.nbytes + 1, np.uint8)
    x = raw[1:].view(values.dtype)
    x[...] = values
    return x


def _misaligned(rank, size):
    """Every collective on buffers whose items sit at odd addresses, and on empty buffers whose memory
    is at an odd address (an empty ``array.array``'s): the results land in the caller's own memory."""
    failures = []
    empty = np.frombuffer(array.array("d"), np.float64)
    for name, call in (("all_reduce", lambda x: dist.all_reduce(x)), ("broadcast", lambda x: dist.broadcast(x, 0)),
                       ("reduce", lambda x: dist.reduce(x, 0))):
        call(empty)
        for dtype in map(np.dtype, ("float32", "float64", "int16", "complex128")):
            for count in (1, 7, 1000, 100_003):
                x = _at_odd_address(make_input(dtype, count, rank))
                call(x)
                inputs = [make_input(dtype, count, r) for r in range(size)]
                want = {"broadcast": inputs[0], "all_reduce": reduced(ReduceOp.SUM, inputs),
                        "reduce": reduced(ReduceOp.SUM, inputs) if rank == 0 else inputs[rank]}[name]
                if not same(x, want):
                    failures.append(f"{name} {dtype} count={count}")
    for count in (0, 5, 1000):
        failures += all_gather_misses(rank, size, np.dtype(np.float32), count, _at_odd_address)
    return failures


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_buffers_at_odd_addresses(transport):
    assert run_ranks(_misaligned, 3, timeout=60, env={"ALLREDUCE_TRANSPORT": transport}) == [[]] * 3


def _left_fold_bits(rank, size):
    """Values whose rounding depends on the order: the exact bits of ((x0 + x1) + x2) + ... on every rank."""
    return left_fold_misses(lambda x, op: dist.all_reduce(x, op=op), rank, size, 301)


def test_reductions_are_the_left_fold_in_rank_order():
    assert run_ranks(_left_fold_bits, 8, timeout=30) == [[]] * 8


def _async_mixed(rank, size):
    works, arrays = [], []
    for i in range(20):
        x = np.full(3, rank + i, np.int64)
        arrays.append(x)
        if i % 3 == 2:
            dist.all_reduce(x)
        else:
            works.append(dist.all_reduce(x, async_op=True))
    for work in works:
        work.wait()
    return [x.tolist() for x in arrays]


def test_async_calls_mixed_with_blocking_ones():
    want = [[sum(r + i for r in range(3))] * 3 for i in range(20)]
    assert run_ranks(_async_mixed, 3, timeout=30) == [want] * 3


def _spin_windows(rank, size):
    """Rank 1 calls 150 us after each call (busy, so it stays on its core), then 20 ms after: rank 0's
    spin windows while it waits, with the load average read as the cores plus one (our spinning ranks
    and nothing else: where the window follows the peers)."""
    from allreduce.transport.shm import waiting

    load = len(os.sched_getaffinity(0)) + 1.0
    waiting.os.getloadavg = lambda: (load, load, load)
    time.sleep(1.1)  # past the last real reading of the load, which is kept for a second
    lines = dist.default_group().transport.lines
    windows, wrong = [], []
    for i, gap in enumerate([150e-6] * 300 + [20e-3] * 20):
        if rank == 1:
            if gap < 1e-3:
                start = time.perf_counter()
                while time.perf_counter() - start < gap:
                    pass
            else:
                time.sleep(gap)
        x = np.full(2, rank + i, np.float32)
        dist.all_reduce(x)
        if x.tolist() != [2.0 * i + 1] * 2:
            wrong.append(i)
        windows.append(lines.spin)
    return windows, wrong


@engines.only("python")  # the Python engine's spin window; the compiled one reads the peer (tests/native)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks need two cores to spin")
def test_the_spin_window_widens_for_a_steady_slower_peer_and_shrinks_back_when_it_idles():
    options = shm.ShmOptions()
    (windows, wrong), (windows_1, wrong_1) = run_ranks(_spin_windows, 2, timeout=30)
    assert wrong == wrong_1 == []
    # Rank 0 waits for rank 1, unless a loaded machine slows rank 0 more: then rank 1 waits for it.
    steady = windows[:300] + windows_1[:300]
    assert options.spin_s < max(steady) <= options.spin_max_s, max(steady)
    assert min(windows[300:]) == options.spin_s, windows[300:]  # halved back after waits past spin_max_s


@engines.only("python")
def test_the_spin_window_policy():
    from allreduce.transport.shm.linepath import Lines

    lines = Lines.__new__(Lines)  # the policy alone: no segments
    lines.options = shm.ShmOptions(spin_s=50e-6, spin_max_s=300e-6)
    lines.spin = 50e-6
    lines._follow(20e-6)  # a wait within the window changes nothing
    assert lines.spin == 50e-6
    lines._follow(80e-6)  # ended soon after the window: twice that wait
    assert lines.spin == pytest.approx(160e-6)
    lines._follow(200e-6)  # twice would pass the cap
    assert lines.spin == pytest.approx(300e-6)
    lines._follow(5e-3)  # a long wait halves it, never below spin_s
    assert lines.spin == pytest.approx(150e-6)
    for _ in range(5):
        lines._follow(1.0)
    assert lines.spin == 50e-6
    lines.options = shm.ShmOptions(spin_s=1e-3, spin_max_s=300e-6)  # a cap below spin_s: spin_s holds
    lines.spin = 1e-3
    lines._follow(2e-3)
    assert lines.spin == 1e-3


# ---- failures ----------------------------------------------------------------------------------

def _mismatch(how):
    def body(rank, size):
        x = np.ones(10, np.float32)
        try:
            dist.all_reduce(x)
            if how == "count":  # both on the lines
                dist.all_reduce(np.ones(10 + rank, np.float32))
            elif how == "op":
                dist.all_reduce(x, op=ReduceOp.MAX if rank else ReduceOp.SUM)
            else:  # rank 1's broadcast is too big for one round (and broadcasts take no chunks): a schedule
                dist.broadcast(np.ones(10 if rank == 0 else LINE // 4 + 1, np.float32), src=0)
        except dist.AllreduceError as exc:
            return type(exc).__name__, str(exc)
        return "no error", x.tolist()
    return body


@pytest.mark.parametrize("how,words", [("count", "count 11 (expected 10)"), ("op", "op MAX (expected SUM)"),
                                       ("paths", "lines")])
def test_a_mismatch_is_caught_on_every_rank(how, words):
    results = run_ranks(_mismatch(how), 2, timeout=5, env=SHM, expect_errors=True)
    for rank, (kind, message) in enumerate(results):
        assert kind in ("Mismatch", "PeerLost"), (rank, kind, message)
        assert f"rank {rank}/2" in message, message
    assert any(words in message for _, message in results), results


def _killed_while_awaited(rank, size):
    dist.all_reduce(np.ones(4, np.float32))
    if rank == 1:  # the others wait for it in the lines when it dies
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.all_reduce(np.ones(4, np.float32))
    except dist.AllreduceError as exc:
        return time.monotonic() - start - 0.5, type(exc).__name__, str(exc)
    return None


def test_a_dead_peer_is_seen_within_two_seconds():
    results = run_ranks(_killed_while_awaited, 3, timeout=60, env=SHM, expect_errors=True)
    assert results[1] == ("killed", -signal.SIGKILL)
    for rank in (0, 2):
        late, kind, message = results[rank]
        assert late < 2.0 and kind == "PeerLost", results[rank]
        assert f"rank {rank}/3: all_reduce #2 (lines)" in message and "rank 1" in message, message
