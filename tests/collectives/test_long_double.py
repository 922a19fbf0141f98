"""numpy's long double and its complex through every collective, on both engines, over shared memory
and TCP, against a numpy reference computed here: inputs carry a fraction (2**-56) that a double
next to them would lose, so a path that narrowed them on the way gives other sums. The compiled
kernels have no long-double loop: its folds are numpy's, its copies the engines' own."""

from __future__ import annotations

import numpy as np
import pytest

from support import engines
from support.harness import run_ranks
from support.reference import counts_for, make_input, reduced, reduction_misses, same

pytestmark = [engines.BOTH, pytest.mark.skipif(np.dtype(np.longdouble) == np.dtype(np.float64),
                                               reason="long double is double here")]

LONG = (np.dtype(np.longdouble), np.dtype(np.clongdouble))
FINE = 2.0 ** -56  # below a double's last bit next to the inputs' small integers, within a long double's


def _input(dtype: np.dtype, count: int, rank: int, op, salt: int = 0) -> np.ndarray:
    """Small integers (exact in any order of combination) plus ``rank + 1`` fine steps, except for
    PRODUCT, whose products of such sums would round."""
    from allreduce.ops import ReduceOp

    values = make_input(dtype, count, rank, op, salt)
    if op is ReduceOp.PRODUCT:
        return values
    step = dtype.type(FINE) * (rank + 1)
    return values + (step * (1 + 1j) if dtype.kind == "c" else step)


def _every_collective(rank, size):
    """Each collective of each long dtype over counts that break naive code (and one of several line
    chunks); the cases that went wrong here."""
    import allreduce as dist
    from allreduce import algorithms
    from allreduce.ops import ReduceOp, allowed_ops

    wrong = []
    for dtype in LONG:
        counts = counts_for(size) + [5003]
        for op in sorted(allowed_ops(dtype)):
            for count in counts:
                wrong += reduction_misses(rank, size, dtype, op, count, make=_input)
                inputs = [_input(dtype, count, r, op) for r in range(size)]
                for algo in algorithms.names("all_reduce"):
                    x = inputs[rank].copy()
                    dist.all_reduce(x, op=op, algorithm=algo)
                    if not same(x, reduced(op, inputs)):
                        wrong.append(f"all_reduce {algo} {dtype} {op.name} count={count}")
                whole = [_input(dtype, size * count, r, op, salt=1) for r in range(size)]
                out = np.empty(count, dtype)
                dist.reduce_scatter_tensor(out, whole[rank].copy(), op=op)
                if not same(out, reduced(op, whole)[rank * count:(rank + 1) * count]):
                    wrong.append(f"reduce_scatter_tensor {dtype} {op.name} count={count}")
        for count in counts:
            mine = _input(dtype, count, rank, ReduceOp.SUM, salt=2)
            everyone = [_input(dtype, count, r, ReduceOp.SUM, salt=2) for r in range(size)]
            root = (count + 1) % size
            x = mine.copy()
            dist.broadcast(x, src=root)
            if not same(x, everyone[root]):
                wrong.append(f"broadcast {dtype} count={count}")
            gathered = np.empty(size * count, dtype)
            dist.all_gather_into_tensor(gathered, mine)
            if not same(gathered, np.concatenate(everyone)):
                wrong.append(f"all_gather_into_tensor {dtype} count={count}")
            blocks = [np.empty(count, dtype) for _ in range(size)] if rank == root else None
            dist.gather(mine, blocks, dst=root)
            if rank == root and not all(same(b, e) for b, e in zip(blocks, everyone)):
                wrong.append(f"gather {dtype} count={count}")
            sent = [_input(dtype, size * count, r, ReduceOp.SUM, salt=3) for r in range(size)]
            got = np.empty(size * count, dtype)
            dist.all_to_all_single(got, sent[rank])
            if not same(got, np.concatenate([s[rank * count:(rank + 1) * count] for s in sent])):
                wrong.append(f"all_to_all_single {dtype} count={count}")
            out = np.empty(count, dtype)
            dist.scatter(out, [s[:count] for s in sent] if rank == root else None, src=root)
            if not same(out, sent[rank][:count]):
                wrong.append(f"scatter {dtype} count={count}")
    return wrong


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("size", [2, 3])
def test_long_doubles_through_every_collective(size, transport):
    wrong = run_ranks(_every_collective, size, timeout=60, deadline=400, env={"ALLREDUCE_TRANSPORT": transport})
    assert wrong == [[]] * size

