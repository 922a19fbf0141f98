"""The small-message path (the shared-memory lines): every collective it serves, every dtype and op,
counts up to a full line, against numpy; the same bits as the left fold in rank order; async calls
mixed with blocking ones; and its failures: mismatch (on the lines, and between the lines and the
schedules) and a dead peer. (A timeout on the lines, with its stall report, is in tests/faults.)"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from support.harness import run_ranks
from support.reference import make_input, reduced, same

import allreduce as dist
from allreduce.dtypes import SUPPORTED, bfloat16
from allreduce.ops import ReduceOp, allowed_ops
from allreduce.transport import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64")

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
            outs = [np.empty(count, dtype) for _ in range(size)]
            dist.all_gather(outs, make_input(dtype, count, rank))
            if not all(same(o, make_input(dtype, count, r)) for r, o in enumerate(outs)):
                failures.append(f"all_gather {dtype} count={count}")
            dist.barrier()
    return failures


@pytest.mark.parametrize("size", [1, 2, 3, pytest.param(5, marks=pytest.mark.slow),
                                  pytest.param(8, marks=pytest.mark.slow)])
def test_every_collective_dtype_op_and_count_on_the_lines(size):
    assert run_ranks(_every_shape, size, timeout=60, deadline=240, env=SHM) == [[]] * size


def _left_fold_bits(rank, size):
    """Sums, averages and products of values whose rounding depends on the order: the exact bits of
    ((x0 + x1) + x2) + ... on every rank."""
    wrong = []
    for dtype in (np.float32, np.float64, bfloat16 or np.float16):
        for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT):
            inputs = [np.random.default_rng([r, int(op)]).normal(size=301).astype(dtype) for r in range(size)]
            x = inputs[rank].copy()
            dist.all_reduce(x, op=op)
            want = inputs[0].copy()
            ufunc = np.multiply if op is ReduceOp.PRODUCT else np.add
            for other in inputs[1:]:
                ufunc(want, other, out=want)
            if op is ReduceOp.AVG:
                np.divide(want, size, out=want, casting="unsafe")
            if x.tobytes() != want.tobytes():
                wrong.append(f"{np.dtype(dtype)} {op.name}")
    return wrong


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
            else:  # rank 1's call is too big for a line: it runs a schedule
                dist.all_reduce(np.ones(10 if rank == 0 else LINE, np.float32))
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
