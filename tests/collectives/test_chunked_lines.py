"""Medium all-reduces and reduces through the shared-memory lines in chunks: every dtype and op, counts
that straddle the chunks and the ranks' slices, against numpy and bit for bit against the left fold in
rank order; the choice between one round, chunks and the schedules; mismatches between them.

Lines of a few hundred bytes (``ALLREDUCE_SHM_LINE_MAX``, ``ALLREDUCE_SHM_LINE_CHUNK``) make small
arrays take many chunks, so every boundary case is cheap to reach."""

from __future__ import annotations

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks
from support.reference import left_fold_misses, reduction_misses

import allreduce as dist
from allreduce.dtypes import SUPPORTED
from allreduce.ops import allowed_ops
from allreduce.transport import shm

pytestmark = [pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64"),
              engines.BOTH]

AT_ONCE, CHUNK, MOST = 256, 320, 64 << 10  # bytes: one round, a line's chunk, chunks at most
SMALL = {"ALLREDUCE_TRANSPORT": "shm", "ALLREDUCE_SHM_LINE_MAX": str(AT_ONCE),
         "ALLREDUCE_SHM_LINE_CHUNK": str(CHUNK), "ALLREDUCE_SHM_CHUNKED_MAX": str(MOST)}


def counts(dtype: np.dtype, size: int) -> list[int]:
    """Just past one round; around one and two chunks; a chunk's last slice shorter than the world; a prime."""
    per_line = CHUNK // dtype.itemsize
    first = AT_ONCE // dtype.itemsize + 1
    return sorted({first, per_line - 1, per_line, per_line + 1, 2 * per_line + size - 1, 3 * per_line + 1, 1009})


def _every_dtype_and_op(rank, size):
    failures = []
    for dtype in map(np.dtype, SUPPORTED):
        for op in sorted(allowed_ops(dtype)):
            for count in counts(dtype, size):
                failures += reduction_misses(rank, size, dtype, op, count)
    float64 = np.dtype(np.float64)
    group = dist.default_group()
    chosen = {group.algorithm_for("all_reduce", None, count * 8, float64) for count in counts(float64, size)}
    if "chunked_lines" not in chosen:
        failures.append(f"no call took the lines in chunks: {chosen}")
    return failures


@pytest.mark.parametrize("size", [2, 3, pytest.param(5, marks=pytest.mark.slow),
                                  pytest.param(8, marks=pytest.mark.slow)])
def test_every_dtype_op_and_count_in_chunks(size):
    assert run_ranks(_every_dtype_and_op, size, timeout=60, deadline=300, env=SMALL) == [[]] * size


def _left_fold_bits(rank, size):
    """Values whose rounding depends on the order: every rank gets ((x0 + x1) + x2) + ..., bit for bit,
    across chunks as within one (three chunks and a few values of any of the dtypes)."""
    return left_fold_misses(lambda x, op: dist.all_reduce(x, op=op), rank, size, 3 * CHUNK // 2 + 5)


def test_chunks_give_the_left_fold_in_rank_order():
    assert run_ranks(_left_fold_bits, 6, timeout=30, env=SMALL) == [[]] * 6


def _paths(rank, size):
    """Which path each size takes; a two-dimensional array in chunks."""
    taken = {}
    for count in (AT_ONCE // 4, AT_ONCE // 4 + 1, MOST // 4, MOST // 4 + 1):
        x = np.arange(count, dtype=np.float32) + rank
        dist.all_reduce(x)
        assert np.array_equal(x, size * np.arange(count, dtype=np.float32) + sum(range(size)))
        taken[count] = dist.default_group().algorithm_for("all_reduce", None, count * 4, np.dtype(np.float32))
    grid = np.full((7, 143), rank + 1, np.float64)
    dist.all_reduce(grid)
    assert np.all(grid == sum(range(1, size + 1)))
    return taken


def test_one_round_then_chunks_then_the_schedules():
    taken = run_ranks(_paths, 3, timeout=30, env=SMALL)
    assert taken[1:] == taken[:-1]
    want = {AT_ONCE // 4: "lines", AT_ONCE // 4 + 1: "chunked_lines", MOST // 4: "chunked_lines"}
    assert {count: taken[0][count] for count in want} == want
    assert taken[0][MOST // 4 + 1] not in ("lines", "chunked_lines")


def _mismatch(how):
    def body(rank, size):
        try:
            dist.all_reduce(np.ones(10, np.float32))
            if how == "count":  # both in chunks, different counts
                dist.all_reduce(np.ones(1000 + rank, np.float32))
            elif how == "round":  # rank 1 takes one round, rank 0 chunks
                dist.all_reduce(np.ones(1000 if rank == 0 else 10, np.float32))
            else:  # rank 1's call is too big for the lines: it runs a schedule
                dist.all_reduce(np.ones(1000 if rank == 0 else MOST // 4 + 1, np.float32))
        except dist.AllreduceError as exc:
            return type(exc).__name__, str(exc)
        return "no error", ""
    return body


@pytest.mark.parametrize("how,words", [("count", "count 1001 (expected 1000)"), ("round", "count"),
                                       ("paths", "lines")])
def test_a_mismatch_in_chunks_is_caught_on_every_rank(how, words):
    results = run_ranks(_mismatch(how), 2, timeout=5, env=SMALL, expect_errors=True)
    for rank, (kind, message) in enumerate(results):
        assert kind in ("Mismatch", "PeerLost"), (rank, kind, message)
        assert f"rank {rank}/2" in message, message
    assert any(words in message for _, message in results), results
