"""Deterministic mode on real ranks: all_reduce, reduce and reduce_scatter return the bytes of the
numpy left fold over ranks, whatever algorithm is asked for, over TCP and shared memory, in a group
spread over (pretend) hosts, and through the torch backend and ``DistributedOptimizer``.

Inputs mix magnitudes from 1e-6 to 1e6 and signed zeros, so a different order of additions would
change the bits (``tests/unit/test_deterministic_schedules.py`` shows the ring's and the tree's do)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support import engines
from support.harness import free_port, run_ranks
from support.reference import reduced

import allreduce as dist
from allreduce.dtypes import bfloat16
from allreduce.ops import ReduceOp
from allreduce.transport import shm

pytestmark = engines.BOTH  # the lines run in Python and in C

DTYPES = [np.dtype(np.float32), np.dtype(np.float64)] + ([bfloat16] if bfloat16 is not None else [])
COUNTS = (1, 7, 1000)  # and 2**18 for float32 (the unit tests run the whole matrix without processes)
ASKED = (None, "tree")  # None: auto; every other name runs as "tree" does (the unit tests check them all)
needs_shm = pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64")


def order_sensitive(dtype: np.dtype, count: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s input: magnitudes 1e-6..1e6 of both signs, 5% signed zeros; any rank can rebuild it."""
    rng = np.random.default_rng([rank, count, dtype.num])
    values = rng.standard_normal(count) * 10.0 ** rng.integers(-6, 7, count)
    values[rng.random(count) < 0.05] = -0.0
    return values.astype(dtype)


def left_fold(op: ReduceOp, dtype: np.dtype, count: int, size: int, part=slice(None)) -> np.ndarray:
    return reduced(op, [order_sensitive(dtype, count, r)[part] for r in range(size)])


def _matrix(rank: int, size: int) -> list[str]:
    """Every collective, dtype, count and asked-for algorithm; the cases whose bytes differ."""
    dist.use_deterministic_algorithms(True)
    wrong = []
    for dtype in DTYPES:
        for count in COUNTS + ((2**18,) if dtype == np.float32 else ()):
            want = left_fold(ReduceOp.SUM, dtype, count, size)
            for asked in ASKED:
                x = order_sensitive(dtype, count, rank)
                dist.all_reduce(x, algorithm=asked)
                if x.tobytes() != want.tobytes():
                    wrong.append(f"all_reduce {dtype} {count} {asked}")
            root = count % size
            x = order_sensitive(dtype, count, rank)
            dist.reduce(x, dst=root)
            if rank == root and x.tobytes() != want.tobytes():
                wrong.append(f"reduce {dtype} {count} root {root}")
            block = -(-count // size)
            inp = order_sensitive(dtype, size * block, rank)
            out = np.empty(block, dtype)
            dist.reduce_scatter_tensor(out, inp)
            mine = left_fold(ReduceOp.SUM, dtype, size * block, size, slice(rank * block, (rank + 1) * block))
            if out.tobytes() != mine.tobytes():
                wrong.append(f"reduce_scatter {dtype} {block}")
    for op in (ReduceOp.AVG, ReduceOp.PRODUCT):
        x = order_sensitive(np.dtype(np.float32), 1000, rank)
        dist.all_reduce(x, op=op)
        if x.tobytes() != left_fold(op, np.dtype(np.float32), 1000, size).tobytes():
            wrong.append(f"all_reduce {op.name}")
    return wrong


@pytest.mark.parametrize("transport", ["tcp", pytest.param("shm", marks=needs_shm)])
def test_left_fold_on_both_transports(transport):
    results = run_ranks(_matrix, 4, env={"ALLREDUCE_TRANSPORT": transport}, deadline=180)
    assert results == [[]] * 4


def _from_env(rank: int, size: int) -> tuple[bool, list[str]]:
    wrong = []
    for count in (7, 4097):
        x = order_sensitive(np.dtype(np.float32), count, rank)
        dist.all_reduce(x, algorithm="ring")
        if x.tobytes() != left_fold(ReduceOp.SUM, np.dtype(np.float32), count, size).tobytes():
            wrong.append(f"all_reduce {count}")
    return dist.are_deterministic_algorithms_enabled(), wrong


def test_environment_turns_it_on_for_three_ranks():
    assert run_ranks(_from_env, 3, env={"ALLREDUCE_DETERMINISTIC": "1"}) == [(True, [])] * 3


def _on_two_hosts(rank: int, size: int) -> list[str]:
    os.environ["ALLREDUCE_HOST_ID"] = f"host{rank // 2}"
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{_on_two_hosts.port}", rank=rank, world_size=size,
                            timeout=30)
    try:
        dist.use_deterministic_algorithms(True)
        wrong = []
        for count in (7, 100_003):
            x = order_sensitive(np.dtype(np.float64), count, rank)
            dist.all_reduce(x)
            if x.tobytes() != left_fold(ReduceOp.SUM, np.dtype(np.float64), count, size).tobytes():
                wrong.append(f"all_reduce {count}")
        return wrong
    finally:
        dist.destroy_process_group()


@needs_shm
def test_left_fold_in_a_group_over_two_hosts():
    _on_two_hosts.port = free_port()
    assert run_ranks(_on_two_hosts, 4, init=False) == [[]] * 4


def _torch_backend(rank: int, size: int) -> tuple[list[str], dict]:
    import torch
    import torch.distributed as tdist

    import allreduce.torch as art
    from support.torch_harness import batches, model, shard

    torch.set_num_threads(1)
    tdist.init_process_group("allreduce", init_method=f"tcp://127.0.0.1:{_torch_backend.port}", rank=rank,
                             world_size=size)
    try:
        dist.use_deterministic_algorithms(True)
        wrong = []
        x = torch.from_numpy(order_sensitive(np.dtype(np.float32), 5000, rank))
        tdist.all_reduce(x)
        if x.numpy().tobytes() != left_fold(ReduceOp.SUM, np.dtype(np.float32), 5000, size).tobytes():
            wrong.append("torch all_reduce")
        batch, m = batches(1, 48)[0], model()
        local = [p.grad.clone() for p in _gradients(model(), *shard(batch, rank, size))]
        opt = art.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
        _gradients(m, *shard(batch, rank, size))
        opt.synchronize()
        opt.close()
        return wrong, {"local": [g.numpy() for g in local], "reduced": [p.grad.numpy().copy() for p in m.parameters()]}
    finally:
        tdist.destroy_process_group()


def _gradients(m, x, y):
    import torch

    torch.nn.CrossEntropyLoss()(m(x), y).backward()
    return list(m.parameters())


def test_torch_backend_and_distributed_optimizer_fold_in_rank_order():
    pytest.importorskip("torch")
    from support.torch_harness import run_ranks as run_torch_ranks

    _torch_backend.port = free_port()
    results = run_torch_ranks(_torch_backend, 3, init=False, deadline=180)
    for wrong, _ in results:
        assert wrong == []
    grads = [r[1] for r in results]
    for i in range(len(grads[0]["local"])):
        want = reduced(ReduceOp.AVG, [g["local"][i] for g in grads])
        for rank, g in enumerate(grads):
            assert g["reduced"][i].tobytes() == want.tobytes(), (rank, i)


def _only_rank_0_deterministic(rank: int, size: int) -> None:
    dist.use_deterministic_algorithms(rank == 0)
    dist.all_reduce(order_sensitive(np.dtype(np.float32), 1000, rank))


def test_ranks_that_disagree_on_the_mode_fail_with_mismatch():
    results = run_ranks(_only_rank_0_deterministic, 3, timeout=10, expect_errors=True,
                        env={"ALLREDUCE_TRANSPORT": "tcp"})
    assert [r[:2] for r in results] == [("error", "Mismatch")] * 3, results
