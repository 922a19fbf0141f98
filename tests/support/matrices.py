"""The collective matrices every transport runs: each returns the cases that went wrong on this rank.

Each takes ``(rank, size)`` inside a group formed by :func:`support.harness.run_ranks` and checks every
collective against the numpy reference (dtype x op x count x algorithm x root).
"""

from __future__ import annotations

import numpy as np

import allreduce as dist
from allreduce import algorithms
from allreduce.dtypes import SUPPORTED, bfloat16
from allreduce.ops import ReduceOp, allowed_ops

from .reference import counts_for, make_input, reduced, same

FEW_DTYPES = [np.dtype(d) for d in ("float32", "int64", "uint8", "float16", "complex64", "bool")] + (
    [bfloat16] if bfloat16 is not None else [])


def all_reduce_matrix(rank, size):
    wrong = []
    for dtype in SUPPORTED:
        for op in sorted(allowed_ops(dtype)):
            for count in counts_for(size):
                for algo in algorithms.names("all_reduce"):
                    inputs = [make_input(dtype, count, r, op) for r in range(size)]
                    x = inputs[rank].copy()
                    dist.all_reduce(x, op=op, algorithm=algo)
                    if not same(x, reduced(op, inputs)):
                        wrong.append(f"all_reduce {algo} {dtype} {op.name} count={count}")
    return wrong


def rooted_matrix(rank, size):
    wrong = []
    roots = sorted({0, size - 1, size // 2})
    for dtype in FEW_DTYPES:
        op = ReduceOp.SUM if ReduceOp.SUM in allowed_ops(dtype) else ReduceOp.MAX
        for count in counts_for(size):
            for root in roots:
                inputs = [make_input(dtype, count, r, op, salt=1) for r in range(size)]
                for algo in algorithms.names("reduce"):
                    x = inputs[rank].copy()
                    dist.reduce(x, dst=root, op=op, algorithm=algo)
                    expected = reduced(op, inputs) if rank == root else inputs[rank]
                    if not same(x, expected):
                        wrong.append(f"reduce {algo} {dtype} root={root} count={count}")
                for algo in algorithms.names("broadcast"):
                    x = inputs[rank].copy()
                    dist.broadcast(x, src=root, algorithm=algo)
                    if not same(x, inputs[root]):
                        wrong.append(f"broadcast {algo} {dtype} root={root} count={count}")
                for algo in algorithms.names("gather"):
                    gather_list = [np.empty(count, dtype) for _ in range(size)] if rank == root else None
                    dist.gather(inputs[rank], gather_list, dst=root, algorithm=algo)
                    if rank == root and not all(same(g, i) for g, i in zip(gather_list, inputs)):
                        wrong.append(f"gather {algo} {dtype} root={root} count={count}")
                blocks = [make_input(dtype, count, root * 100 + r, op, salt=2) for r in range(size)]
                for algo in algorithms.names("scatter"):
                    out = np.empty(count, dtype)
                    dist.scatter(out, blocks if rank == root else None, src=root, algorithm=algo)
                    if not same(out, blocks[rank]):
                        wrong.append(f"scatter {algo} {dtype} root={root} count={count}")
    return wrong


def block_matrix(rank, size):
    wrong = []
    for dtype in FEW_DTYPES:
        ops = sorted(allowed_ops(dtype))
        for count in counts_for(size):
            mine = make_input(dtype, count, rank, salt=3)
            expected = np.concatenate([make_input(dtype, count, r, salt=3) for r in range(size)])
            for algo in algorithms.names("all_gather"):
                gathered = np.empty(size * count, dtype)
                dist.all_gather_into_tensor(gathered, mine, algorithm=algo)
                if not same(gathered, expected):
                    wrong.append(f"all_gather_into_tensor {algo} {dtype} count={count}")
            as_list = [np.empty(count, dtype) for _ in range(size)]
            dist.all_gather(as_list, mine)
            if not same(np.concatenate(as_list), expected):
                wrong.append(f"all_gather {dtype} count={count}")
            for op in ops:
                inputs = [make_input(dtype, size * count, r, op, salt=4) for r in range(size)]
                for algo in algorithms.names("reduce_scatter"):
                    out = np.empty(count, dtype)
                    dist.reduce_scatter_tensor(out, inputs[rank], op=op, algorithm=algo)
                    if not same(out, reduced(op, inputs)[rank * count:(rank + 1) * count]):
                        wrong.append(f"reduce_scatter_tensor {algo} {dtype} {op.name} count={count}")
            sent = [make_input(dtype, size * count, r, salt=5) for r in range(size)]
            expected = np.concatenate([sent[j][rank * count:(rank + 1) * count] for j in range(size)])
            for algo in algorithms.names("all_to_all"):
                got = np.empty(size * count, dtype)
                dist.all_to_all_single(got, sent[rank], algorithm=algo)
                if not same(got, expected):
                    wrong.append(f"all_to_all_single {algo} {dtype} count={count}")
    return wrong
