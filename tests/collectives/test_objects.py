"""The native API's object collectives, uneven all_to_all_single, split_group and the small queries,
on 1 to 4 forked ranks, against what a single process computes from every rank's input."""

from __future__ import annotations

import numpy as np
import pytest

from support.harness import run_ranks
from support.reference import make_input

SIZES = [1, 2, 3, 4]


def thing(rank: int):
    """Rank ``rank``'s object: sizes differ a lot between ranks (and rank 0's is tiny)."""
    return None if rank == 0 else {"rank": rank, "text": "x" * (rank * 5000), "array": np.arange(rank * 3)}


def same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def object_matrix(rank, size):
    import allreduce as dist

    wrong = []
    everyone = [thing(r) for r in range(size)]
    for root in sorted({0, size - 1}):
        objects = [thing(rank), "second", rank] if rank == root else [None, None, None]
        dist.broadcast_object_list(objects, src=root)
        if not same(objects, [thing(root), "second", root]):
            wrong.append(f"broadcast_object_list root={root}: {objects}")
        out = [None] * size if rank == root else None
        dist.gather_object(thing(rank), out, dst=root)
        if rank == root and not same(out, everyone):
            wrong.append(f"gather_object root={root}")
        box = [None]
        dist.scatter_object_list(box, [thing(r) for r in range(size)] if rank == root else None, src=root)
        if not same(box[0], thing(rank)):
            wrong.append(f"scatter_object_list root={root}: {box}")
    out = [None] * size
    dist.all_gather_object(out, thing(rank))
    if not same(out, everyone):
        wrong.append("all_gather_object")
    return wrong


@pytest.mark.parametrize("size", SIZES)
def test_object_collectives(size):
    assert run_ranks(object_matrix, size) == [[]] * size


def uneven_all_to_all(rank, size):
    import allreduce as dist

    wrong = []
    for width in (1, 3):  # rows of dim 0 carry `width` elements each
        splits = [[(r * 2 + j) % 4 for j in range(size)] for r in range(size)]  # rows from r to j, some empty
        inputs = [make_input(np.int64, sum(s) * width, r).reshape(-1, width) for r, s in enumerate(splits)]
        recv = [splits[j][rank] for j in range(size)]
        out = np.zeros((sum(recv), width), np.int64)
        work = dist.all_to_all_single(out, inputs[rank], output_split_sizes=recv, input_split_sizes=splits[rank],
                                      async_op=width == 3)
        if work is not None:
            work.wait()
        starts = [np.concatenate(([0], np.cumsum(s)[:-1])).astype(int) for s in splits]
        expected = np.concatenate([inputs[j][starts[j][rank]:starts[j][rank] + splits[j][rank]] for j in range(size)])
        if not np.array_equal(out, expected):
            wrong.append(f"width={width}: {out.tolist()} != {expected.tolist()}")
    equal = np.arange(2 * size, dtype=np.float32) + 10 * rank  # only the input is split: output rows are equal
    out = np.zeros(2 * size, np.float32)
    dist.all_to_all_single(out, equal, input_split_sizes=[2] * size)
    if not np.array_equal(out, np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 10 * r for r in range(size)])):
        wrong.append(f"equal splits given: {out}")
    return wrong


@pytest.mark.parametrize("size", SIZES)
def test_all_to_all_single_with_uneven_splits(size):
    assert run_ranks(uneven_all_to_all, size) == [[]] * size


def disagreeing_splits(rank, size):
    import allreduce as dist

    out = np.zeros(3, np.int64)  # expects 3 rows from rank 0, which sends 2 (rank 0) or 1 (rank 1)
    dist.all_to_all_single(out, np.zeros(2 - rank, np.int64), output_split_sizes=[3, 0],
                           input_split_sizes=[2 - rank, 0])


def test_all_to_all_single_names_the_rank_whose_split_disagrees():
    results = run_ranks(disagreeing_splits, 2, expect_errors=True)
    assert results[0][:2] == ("error", "ValueError")
    assert "rank 0 sent 2 elements" in results[0][2] and "output_split_sizes expects 3" in results[0][2]


def groups_and_queries(rank, size):
    import allreduce as dist

    facts = [dist.is_available(), dist.get_backend(), dist.get_local_rank(), dist.get_local_size()]
    reversed_ranks = list(range(size))[::-1]
    g = dist.split_group(split_ranks=[reversed_ranks])  # one group, ranks in reverse order
    out = np.zeros(size, np.int64)
    dist.all_gather_into_tensor(out, np.array([rank], np.int64), group=g)
    evens = [r for r in range(size) if r % 2 == 0]
    odds = [r for r in range(size) if r % 2]
    halves = dist.split_group(g, [evens, odds] if odds else [evens])  # ranks of g, not of the world
    inner = dist.split_group(halves, [[0]])  # a split of a split; only its rank 0 is a member
    out_objects = [None] * dist.get_world_size(halves)
    dist.all_gather_object(out_objects, rank, group=halves)
    return facts, dist.get_rank(g), out.tolist(), out_objects, isinstance(inner, dist.NonMember)


@pytest.mark.parametrize("size", [1, 3, 4])
def test_split_group_orders_ranks_as_given_and_splits_again(size):
    results = run_ranks(groups_and_queries, size)
    for rank, (facts, g_rank, gathered, halves, outside) in enumerate(results):
        assert facts == [True, "allreduce", rank, size]
        assert g_rank == size - 1 - rank
        assert gathered == list(range(size))[::-1]
        g_ranks = list(range(size))[::-1]  # world rank of each rank of g
        mine = [w for i, w in enumerate(g_ranks) if i % 2 == g_ranks.index(rank) % 2]
        assert halves == mine
        assert outside == (mine.index(rank) != 0)


def misuse(rank, size):
    import allreduce as dist

    errors = []
    for call in (lambda: dist.gather_object(rank, [None, None], dst=1 - rank),
                 lambda: dist.all_gather_object([None], rank),
                 lambda: dist.scatter_object_list([], None, src=0),
                 lambda: dist.split_group(split_ranks=[[0, 1], [1]]),
                 lambda: dist.broadcast_object_list([1], src=5)):
        try:
            call()
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_object_collectives_refuse_bad_arguments_before_communicating():
    for errors in run_ranks(misuse, 2):
        assert "object_gather_list must be None on ranks other than dst" in errors[0]
        assert "one item per rank (2), got 1" in errors[1]
        assert "at least one item" in errors[2]
        assert "disjoint" in errors[3]
        assert "src=5 is not a rank" in errors[4]
