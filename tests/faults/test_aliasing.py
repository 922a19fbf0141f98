"""Collectives whose output overlaps their input (the same array, a view, slices of one buffer) give the
numpy reference's result, for every algorithm, on both transports.

A schedule reads its input while it writes its output, so ``all_to_all_single(x, x)`` used to return
wrong data at every size. Each case lays input and output out in one buffer ``buf`` and returns what
this rank got and what the reference says it should get; every rank can rebuild every rank's input.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks
from support.reference import make_input, reduced

import allreduce as dist
from allreduce import algorithms

pytestmark = engines.BOTH  # the lines run in Python and in C

K = 5  # elements per block; every case runs again with K << 14 (320 KiB blocks, which shared memory
# moves cross-memory, straight out of the sender's array)


def inputs(size: int, count: int) -> list[np.ndarray]:
    return [make_input(np.float32, count, r) for r in range(size)]


def all_to_all(rank, size, algorithm, shift, k):
    ins = inputs(size, size * k)
    buf = np.zeros(size * k + shift, np.float32)
    buf[:size * k] = ins[rank]
    out = buf[shift:shift + size * k]
    dist.all_to_all_single(out, buf[:size * k], algorithm=algorithm)
    return out, np.concatenate([ins[j][rank * k:(rank + 1) * k] for j in range(size)])


def all_gather_into_tensor(rank, size, algorithm, at, k):
    ins = inputs(size, k)
    buf = np.zeros(size * k + 1, np.float32)
    start = {"own block": rank * k, "first block": 0, "straddling": k // 2 + 1}[at]
    buf[start:start + k] = ins[rank]
    out = buf[:size * k]
    dist.all_gather_into_tensor(out, buf[start:start + k], algorithm=algorithm)
    return out, np.concatenate(ins)


def reduce_scatter_tensor(rank, size, algorithm, at, k):
    ins = inputs(size, size * k)
    buf = ins[rank].copy()
    start = {"own block": rank * k, "first block": 0, "straddling": k // 2 + 1}[at]
    out = buf[start:start + k]
    dist.reduce_scatter_tensor(out, buf, algorithm=algorithm)
    return out, reduced(dist.ReduceOp.SUM, ins)[rank * k:(rank + 1) * k]


def gather(rank, size, algorithm, _, k):
    ins = inputs(size, k)
    buf = np.zeros(size * k, np.float32)
    buf[rank * k:(rank + 1) * k] = ins[rank]
    blocks = [buf[r * k:(r + 1) * k] for r in range(size)]
    dist.gather(blocks[rank], blocks if rank == 0 else None, dst=0, algorithm=algorithm)
    return buf, np.concatenate(ins if rank == 0 else [ins[r] if r == rank else np.zeros(k, np.float32)
                                                      for r in range(size)])


def scatter(rank, size, algorithm, _, k):
    ins = inputs(size, size * k)
    buf = ins[rank].copy()
    blocks = [buf[r * k:(r + 1) * k] for r in range(size)]
    dist.scatter(blocks[(rank + 1) % size], blocks if rank == 0 else None, src=0, algorithm=algorithm)
    return blocks[(rank + 1) % size], ins[0][rank * k:(rank + 1) * k]


def all_gather(rank, size, algorithm, _, k):
    ins = inputs(size, k)
    buf = np.zeros(size * k, np.float32)
    buf[rank * k:(rank + 1) * k] = ins[rank]
    blocks = [buf[r * k:(r + 1) * k] for r in range(size)]
    dist.all_gather(blocks, blocks[rank], algorithm=algorithm)
    return buf, np.concatenate(ins)


def reduce_scatter(rank, size, algorithm, _, k):
    ins = inputs(size, size * k)
    buf = ins[rank].copy()
    blocks = [buf[r * k:(r + 1) * k] for r in range(size)]
    dist.reduce_scatter(blocks[0], blocks, algorithm=algorithm)
    return blocks[0], reduced(dist.ReduceOp.SUM, ins)[rank * k:(rank + 1) * k]


CASES = (  # (collective whose algorithms run, call, layouts)
    [("all_to_all", all_to_all, shift) for shift in (0, 1, K)]
    + [(c, fn, at) for c, fn in (("all_gather", all_gather_into_tensor), ("reduce_scatter", reduce_scatter_tensor))
       for at in ("own block", "first block", "straddling")]
    + [("gather", gather, None), ("scatter", scatter, None), ("all_gather", all_gather, None),
       ("reduce_scatter", reduce_scatter, None)]
)


def _every_case(rank, size):
    wrong = []
    for k in (K, K << 14):
        for collective, fn, layout in CASES:
            for algorithm in algorithms.names(collective):
                got, want = fn(rank, size, algorithm, layout, k)
                if not np.array_equal(got, want):
                    wrong.append((fn.__name__, k, layout, algorithm, got[:8].tolist(), want[:8].tolist()))
    return wrong


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_overlapping_input_and_output_give_the_reference_result(transport):
    results = run_ranks(_every_case, 3, timeout=20, deadline=120, env={"ALLREDUCE_TRANSPORT": transport})
    wrong = [(rank, *case) for rank, cases in enumerate(results) for case in cases]
    assert not wrong, f"{len(wrong)} wrong results:\n" + "\n".join(map(str, wrong[:10]))
