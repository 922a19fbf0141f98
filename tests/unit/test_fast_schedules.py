"""Pure tests of the latency- and bandwidth-optimised schedules (recursive doubling, Rabenseifner, double
binary tree, Bruck, recursive halving) and of every algorithm's cost formula.

Correctness over the size x count matrix comes from the registry-driven ``test_schedules.py``; here
are the properties that make each algorithm worth having (round counts, bytes, the double tree's
disjoint interiors), same bits on every rank with real floats, and the check that each closed-form
cost agrees with pricing the schedule itself step by step.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.numeric import Numeric

from allreduce import collectives
from allreduce.algorithms import ALGORITHMS, get, names
from allreduce.algorithms.double_tree import trees
from allreduce.algorithms.schedule import Recv, Send
from allreduce.algorithms.verify import walk

POWERS = [1, 2, 4, 8, 16]
OTHERS = [3, 5, 6, 7, 9, 12, 13, 17]


def schedules(collective, name, size, count, **options):
    fn = get(collective, name)
    return [fn(rank, size, count, **options) for rank in range(size)]


def step_counts(collective, name, size, count=10):
    return {len(s.steps) for s in schedules(collective, name, size, count)}


# --- round counts and volume ----------------------------------------------------------------------


@pytest.mark.parametrize("size", POWERS + OTHERS)
def test_recursive_doubling_rounds(size):
    folded = 0 if size in POWERS else 2
    assert step_counts("all_reduce", "recursive_doubling", size) == {size.bit_length() - 1 + folded}


@pytest.mark.parametrize("size", POWERS + OTHERS)
def test_rabenseifner_rounds(size):
    folded = 0 if size in POWERS else 2
    assert step_counts("all_reduce", "rabenseifner", size) == {2 * (size.bit_length() - 1) + folded}


@pytest.mark.parametrize("size", [2, 4, 8, 16])
def test_rabenseifner_sends_what_ring_sends(size):
    count = 24 * size
    for schedule in schedules("all_reduce", "rabenseifner", size, count):
        assert schedule.bytes_sent(1) == 2 * (size - 1) * count // size


@pytest.mark.parametrize("size", POWERS + OTHERS)
def test_recursive_halving_rounds_and_volume(size):
    p = 1 << (size.bit_length() - 1)
    rounds = p.bit_length() - 1 + (0 if p == size else 2)
    assert step_counts("reduce_scatter", "recursive_halving", size) == {max(1, rounds)}  # one rank: a copy
    if size == p:
        count = 3
        for schedule in schedules("reduce_scatter", "recursive_halving", size, count):
            assert schedule.bytes_sent(1) == (size - 1) * count


@pytest.mark.parametrize("size", range(1, 18))
def test_bruck_is_logarithmic_and_sends_little(size):
    count = 3
    rounds = max(1, (size - 1).bit_length())
    assert step_counts("all_gather", "bruck", size, count) == {rounds}
    assert step_counts("all_to_all", "bruck", size, count) == {rounds}
    set_bits = sum(bin(j).count("1") for j in range(size))
    for gather, exchange in zip(schedules("all_gather", "bruck", size, count),
                                schedules("all_to_all", "bruck", size, count)):
        assert gather.bytes_sent(1) == (size - 1) * count
        assert exchange.bytes_sent(1) == set_bits * count
        assert max(len({op.peer for op in step if isinstance(op, Send)}) for step in exchange.steps) <= 1


# --- the double binary tree -----------------------------------------------------------------------


@pytest.mark.parametrize("size", range(1, 65))
def test_double_tree_shape(size):
    first, second = trees(size)
    for tree in (first, second):
        roots = [r for r in range(size) if tree.parent[r] is None]
        assert len(roots) == 1
        for r in range(size):
            assert len(tree.children[r]) <= 2
            for c in tree.children[r]:
                assert tree.parent[c] == r and tree.depth[c] == tree.depth[r] + 1
        assert sum(len(c) for c in tree.children) == size - 1
        assert tree.top == size.bit_length() - 1
    interior = [{r for r in range(size) if tree.children[r]} for tree in (first, second)]
    assert not interior[0] & interior[1], "a rank is interior in both trees"
    if size > 2:
        assert interior[0] and interior[1]


@pytest.mark.parametrize("size,count,chunk", [(2, 10, 5), (7, 30, 3), (16, 100, 1), (17, 9, 100)])
def test_double_tree_pipeline_length(size, count, chunk):
    per_half = -(-((count + 1) // 2) // chunk)
    lengths = {len(s.steps) for s in schedules("all_reduce", "double_tree", size, count, chunk=chunk)}
    assert lengths == {per_half + 2 * (size.bit_length() - 1) - 1}


def test_double_tree_halves_the_forwarding():
    size, count = 16, 1 << 12
    single = max(s.bytes_sent(1) for s in schedules("all_reduce", "tree", size, count))
    double = max(s.bytes_sent(1) for s in schedules("all_reduce", "double_tree", size, count))
    assert double == 2 * count and single == 3 * count


# --- same bits on every rank, with real floats ----------------------------------------------------


@pytest.mark.parametrize("name", names("all_reduce"))
@pytest.mark.parametrize("size", [2, 3, 5, 8, 13])
def test_all_reduce_leaves_the_same_bits_everywhere(name, size):
    count = 37
    rng = np.random.default_rng(size)
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(size)]
    options = {"chunk": 4} if "chunk" in get("all_reduce", name).options else {}
    plan = schedules("all_reduce", name, size, count, **options)
    model = Numeric([{"data": x.copy(), "out": np.empty(0, np.float32), "tmp": np.empty(s.tmp, np.float32)}
                     for x, s in zip(inputs, plan)])
    walk(plan, [{buf: len(a) for buf, a in b.items()} for b in model.buffers], model)
    results = [b["data"] for b in model.buffers]
    assert all(np.array_equal(results[0].view(np.uint32), r.view(np.uint32)) for r in results)
    np.testing.assert_allclose(results[0], np.sum(inputs, axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)


# --- costs ----------------------------------------------------------------------------------------


def test_every_algorithm_has_a_cost():
    for entry in ALGORITHMS:
        cost = entry.cost
        assert cost(n=1, m=1 << 20, alpha=1e-5, beta=1e-9, gamma=1e-10) == 0
        small, large = cost(8, 1 << 10, 1e-5, 1e-9, 1e-10), cost(8, 1 << 20, 1e-5, 1e-9, 1e-10)
        assert 0 < small <= large


PIPELINED = sorted((a.collective, a.name) for a in ALGORITHMS if "chunk" in a.options)


def priced_step_by_step(collective, name, size, count, alpha, beta, gamma, **options):
    """Each step costs alpha (if anything moves: a rank's messages of one step overlap) plus its busiest
    rank's bytes sent and reduced. The closed forms in ``EXACT`` follow this model to the last byte."""
    plan = schedules(collective, name, size, count, **options)
    total = 0.0
    for s in range(max(len(p.steps) for p in plan)):
        steps = [p.steps[s] if s < len(p.steps) else () for p in plan]
        sent = [sum(op.src.count for op in ops if isinstance(op, Send)) for ops in steps]
        reduced = [sum(op.dst.count for op in ops if isinstance(op, Recv) and op.reduce) for ops in steps]
        total += (alpha if any(sent) else 0) + beta * max(sent) + gamma * max(reduced)
    return total


EXACT = [("all_reduce", "ring"), ("all_reduce", "reduce_bcast"), ("all_reduce", "recursive_doubling"),
         ("all_reduce", "rabenseifner"), ("reduce", "binomial"), ("broadcast", "binomial"), ("all_gather", "ring"),
         ("all_gather", "bruck"), ("reduce_scatter", "ring"), ("reduce_scatter", "recursive_halving"),
         ("all_to_all", "pairwise"), ("all_to_all", "bruck"), ("gather", "binomial"), ("scatter", "binomial")]


@pytest.mark.parametrize("collective,name", EXACT)
@pytest.mark.parametrize("size", [2, 4, 5, 8, 12, 16])
def test_cost_formula_matches_the_schedule(collective, name, size):
    count = 16 * 3 * 5 * 7  # divisible by every power of two up to 16 and by every world size here
    m = count * (size if collectives.get(collective).split else 1)  # m covers n blocks
    alpha, beta, gamma = 1e-5, 1e-9, 3e-10
    formula = get(collective, name).cost(size, m, alpha, beta, gamma)
    assert formula == pytest.approx(priced_step_by_step(collective, name, size, count, alpha, beta, gamma),
                                    rel=1e-9)


@pytest.mark.parametrize("collective,name", PIPELINED)
@pytest.mark.parametrize("size", [8, 16])
def test_pipelined_cost_is_close_to_the_schedule(collective, name, size):
    count, chunk = 1 << 12, 1 << 8
    alpha, beta, gamma = 1e-5, 1e-9, 3e-10
    formula = get(collective, name).cost(size, count, alpha, beta, gamma, chunk_bytes=chunk)
    stepwise = priced_step_by_step(collective, name, size, count, alpha, beta, gamma, chunk=chunk)
    assert formula == pytest.approx(stepwise, rel=0.15)
    best = get(collective, name).cost(size, count, alpha, beta, gamma)
    assert best <= formula


def test_costs_rank_algorithms_sensibly():
    def price(name, m):
        return get("all_reduce", name).cost(64, m, 1e-5, 1e-9, 1e-10)

    others = ["ring", "tree", "reduce_bcast", "rabenseifner", "double_tree"]
    assert all(price("recursive_doubling", 64) < price(name, 64) for name in others)
    assert price("rabenseifner", 64) < price("ring", 64)
    assert max(price("ring", 1 << 30), price("rabenseifner", 1 << 30)) < min(
        price(name, 1 << 30) for name in ["tree", "reduce_bcast", "recursive_doubling", "double_tree"])
    assert price("double_tree", 1 << 30) < price("tree", 1 << 30)
