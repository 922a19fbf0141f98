"""Pure tests of the schedules: every registered algorithm is run symbolically (no processes) over a
matrix of world sizes, counts and roots, plus random cases; and the verifier itself is shown to catch
broken schedules, so that a green matrix means something."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allreduce import collectives
from allreduce.algorithms import COLLECTIVES, DEFAULTS, get, names
from allreduce.algorithms.schedule import Copy, Recv, Region, Schedule, Send
from allreduce.algorithms.verify import ScheduleError, run_symbolic, verify, verify_schedules

ALGORITHMS = [(collective, name) for collective in COLLECTIVES for name in names(collective)]
PIPELINED = {(c, n) for c, n in ALGORITHMS if "chunk" in get(c, n).options}


def counts_for(size: int) -> list[int]:
    return sorted({c for c in (0, 1, 2, size - 1, size, size + 1, 7, 13, 64, 1000) if c >= 0})


def roots_for(collective: str, size: int) -> list[int]:
    return sorted({0, size - 1, size // 2}) if collectives.get(collective).rooted else [0]


def data(n: int) -> Region:
    return Region("data", 0, n)


# --- every algorithm computes its collective ------------------------------------------------------


@pytest.mark.parametrize("size", range(1, 18))
@pytest.mark.parametrize("collective,name", ALGORITHMS)
def test_matrix(collective, name, size):
    for options in [{}, {"chunk": 3}] if (collective, name) in PIPELINED else [{}]:
        for count in counts_for(size):
            for root in roots_for(collective, size):
                verify(collective, name, size, count, root, **options)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_random_cases(draw):
    collective, name = draw.draw(st.sampled_from(ALGORITHMS))
    size = draw.draw(st.integers(1, 33))
    count = draw.draw(st.integers(0, 200))
    root = draw.draw(st.integers(0, size - 1))
    options = {"chunk": draw.draw(st.integers(1, 70))} if (collective, name) in PIPELINED else {}
    verify(collective, name, size, count, root, **options)


# --- costs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8, 16])
def test_ring_all_reduce_is_bandwidth_optimal(size):
    count = 12 * size
    for rank in range(size):
        schedule = get("all_reduce", "ring")(rank, size, count)
        assert len(schedule.steps) == 2 * (size - 1)
        assert schedule.bytes_sent(1) == 2 * (size - 1) * count // size


@pytest.mark.parametrize("size,count,chunk", [(2, 10, 5), (7, 30, 3), (16, 100, 1), (17, 9, 100)])
def test_tree_pipeline_length(size, count, chunk):
    chunks, depth = -(-count // chunk), (size).bit_length() - 1
    lengths = {len(get("all_reduce", "tree")(rank, size, count, chunk=chunk).steps) for rank in range(size)}
    assert max(lengths) == chunks + 2 * depth - 1


@pytest.mark.parametrize("collective,name", [("reduce", "binomial"), ("broadcast", "binomial"),
                                             ("gather", "binomial"), ("scatter", "binomial"),
                                             ("barrier", "dissemination")])
@pytest.mark.parametrize("size", [2, 3, 8, 9, 17])
def test_logarithmic_step_count(collective, name, size):
    fn = get(collective, name)
    assert max(len(fn(rank, size, 5, root=size - 1).steps) for rank in range(size)) == (size - 1).bit_length()


def test_pairwise_sends_each_block_once():
    size, count = 6, 4
    for rank in range(size):
        schedule = get("all_to_all", "pairwise")(rank, size, count)
        assert len(schedule.steps) == size - 1
        assert schedule.bytes_sent(1) == (size - 1) * count


# --- registry and arguments -----------------------------------------------------------------------


def test_registry_lists_what_exists():
    assert set(DEFAULTS) == set(COLLECTIVES)
    for collective, name in DEFAULTS.items():
        assert name in names(collective)
    with pytest.raises(ValueError, match="ring, tree, reduce_bcast"):
        get("all_reduce", "butterfly")
    with pytest.raises(ValueError, match="all_reduce, reduce, broadcast"):
        get("allreduce", "ring")
    with pytest.raises(ValueError, match="known"):
        names("nope")


@pytest.mark.parametrize("collective,name", ALGORITHMS)
def test_schedule_functions_are_cached_and_validate(collective, name):
    fn = get(collective, name)
    assert fn(1, 4, 10, root=2) is fn(1, 4, 10, root=2)
    for rank, size, count, root in [(4, 4, 1, 0), (-1, 4, 1, 0), (0, 0, 1, 0), (0, 4, -1, 0), (0, 4, 1, 4)]:
        with pytest.raises(ValueError):
            fn(rank, size, count, root=root)
    with pytest.raises(TypeError, match=f"{name}' takes no option no_such_option; its options: "):
        fn(0, 4, 1, no_such_option=1)


def test_entries_declare_their_options_and_needs():
    hierarchical = get("all_reduce", "hierarchical")
    assert dict(hierarchical.options) == {"cross": "ring"} and hierarchical.needs == ("hosts",)
    with pytest.raises(TypeError, match="its options: cross, hosts"):
        hierarchical(0, 4, 8, chunk=2)
    with pytest.raises(TypeError, match="its options: none"):
        get("all_reduce", "ring")(0, 4, 8, chunk=2)
    tree = get("all_reduce", "tree")
    assert tree(0, 4, 1 << 17) == tree.schedule(0, 4, 1 << 17, chunk=tree.options["chunk"])


@pytest.mark.parametrize("collective,name", sorted(PIPELINED))
def test_chunk_must_be_positive(collective, name):
    with pytest.raises(ValueError, match="chunk"):
        get(collective, name)(0, 4, 10, chunk=0)


def test_run_symbolic_exposes_records():
    state = run_symbolic("all_gather", "ring", 3, 2)
    index, counts = state.buffers[1]["out"]
    assert index.tolist() == [0, 1, 0, 1, 0, 1]
    assert counts.tolist() == [[1, 0, 0]] * 2 + [[0, 1, 0]] * 2 + [[0, 0, 1]] * 2


# --- the verifier catches broken schedules --------------------------------------------------------


def broken(collective, schedules, count, match, root=0):
    with pytest.raises(ScheduleError, match=match):
        verify_schedules(collective, [Schedule(tuple(map(tuple, steps)), tmp) for steps, tmp in schedules],
                         count, root)


def test_catches_missing_receive():
    broken("all_reduce", [([[Send(1, data(2))]], 0), ([[]], 0)], 2, "sends 1 message.*posts 0 receive")


def test_catches_length_mismatch():
    broken("broadcast", [([[Send(1, data(2))]], 0), ([[Recv(0, Region("data", 0, 1))]], 0)], 2,
           "2 elements.*1 elements")


def test_catches_double_counting():
    twice = [Send(0, data(1))]
    schedules = [([[Recv(1, data(1), reduce=data(1))], [Recv(1, data(1), reduce=data(1))], [Send(1, data(1))]], 0),
                 ([twice, twice, [Recv(0, data(1))]], 0)]
    broken("all_reduce", schedules, 1, "rank 1 x2")


def test_catches_send_receive_hazard():
    swap = lambda peer: [[Send(peer, data(2)), Recv(peer, data(2))]]  # noqa: E731
    broken("broadcast", [(swap(1), 0), (swap(0), 0)], 2, "overwrites data.*send of the same step reads")


def test_catches_two_receives_into_one_region():
    into = [Recv(1, data(1)), Recv(2, data(1))]
    broken("broadcast", [([into], 0), ([[Send(0, data(1))]], 0), ([[Send(0, data(1))]], 0)], 1, "overlap")


def test_catches_out_of_bounds_and_bad_peers():
    broken("broadcast", [([[Send(1, data(3))]], 0), ([[Recv(0, data(3))]], 0)], 2, r"data\[0:3\] is outside")
    broken("broadcast", [([[Send(0, data(1))]], 0), ([[]], 0)], 1, "names peer 0")
    broken("broadcast", [([[Send(2, data(1))]], 0), ([[]], 0)], 1, "names peer 2")


def test_catches_unwritten_tmp():
    schedules = [([[Recv(1, data(2), reduce=data(2))]], 0), ([[Send(0, Region("tmp", 0, 2))]], 2)]
    broken("reduce", schedules, 2, r"tmp\[0\], which was never written")


def test_catches_mixed_elements():
    schedules = [([[Recv(1, data(1), reduce=data(1))]], 0), ([[Send(0, Region("data", 1, 2))]], 0)]
    broken("reduce", schedules, 2, "reduces element 1 from rank 1 with element 0")


def test_catches_changed_non_root_input():
    schedules = [([[Send(1, data(1))], [Recv(1, data(1))]], 0),
                 ([[Recv(0, data(1), reduce=data(1))], [Send(0, data(1))]], 0)]
    broken("reduce", schedules, 1, "rank 1 ends with data.*want element 0 of rank 1")


def test_catches_changed_reduce_scatter_input():
    block = lambda i: Region("data", i, i + 1)  # noqa: E731
    schedules = [([[Send(1, block(1)), Recv(1, block(0), reduce=block(0))], [Copy(block(0), Region("out", 0, 1))]], 0),
                 ([[Send(0, block(0)), Recv(0, block(1), reduce=block(1))], [Copy(block(1), Region("out", 0, 1))]], 0)]
    broken("reduce_scatter", schedules, 1, "ends with data")


def test_catches_missing_result():
    broken("broadcast", [([[]], 0), ([[]], 0)], 3, "rank 1 ends with data.*want element 0 of rank 0")
    broken("gather", [([[]], 0), ([[]], 0)], 1, r"rank 0 ends with out\[0\] = never written")


def test_catches_early_barrier_exit():
    first_round = [Schedule(get("barrier", "dissemination")(rank, 3, 0).steps[:1], 2) for rank in range(3)]
    with pytest.raises(ScheduleError, match=r"rank 0 leaves the barrier without hearing from ranks \[1\]"):
        verify_schedules("barrier", first_round, 0)


def test_catches_foreign_ops():
    broken("broadcast", [([["send"]], 0), ([[]], 0)], 1, "not a Send, Recv or Copy")


@pytest.mark.parametrize("collective,name", ALGORITHMS)
def test_every_op_is_needed(collective, name):
    """Deleting any one op of a registered schedule must be caught: the verifier can fail."""
    size, count, root = 5, 7, 2
    schedules = [get(collective, name)(rank, size, count, root=root) for rank in range(size)]
    verify_schedules(collective, schedules, count, root)
    for rank, schedule in enumerate(schedules):
        for s, step in enumerate(schedule.steps):
            for k in range(len(step)):
                steps = schedule.steps[:s] + (step[:k] + step[k + 1:],) + schedule.steps[s + 1:]
                mutant = schedules[:rank] + [dataclasses.replace(schedule, steps=steps)] + schedules[rank + 1:]
                with pytest.raises(ScheduleError):
                    verify_schedules(collective, mutant, count, root)
