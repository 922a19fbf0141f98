"""The shared-memory lines as registry entries: their schedules run numerically on every rank give the
lines' results bit for bit, their steps are the lines' rounds, their costs count a round once, and the
planner takes them by the lines' own rule where a group has lines and never elsewhere.

(The symbolic matrix of world sizes and counts covers them through the registry: ``test_schedules.py``.)"""

from __future__ import annotations

import numpy as np
import pytest
from support.numeric import Numeric
from support.reference import reduced

from allreduce import algorithms, collectives, planner
from allreduce.algorithms import lines
from allreduce.algorithms.schedule import Copy, Recv, Send
from allreduce.algorithms.verify import walk
from allreduce.model.network import Link, Network
from allreduce.ops import ReduceOp
from allreduce.planner import costmodel
from allreduce.sim import simulate
from allreduce.transport.shm.options import ShmOptions

ENTRIES = [(a.collective, a.name) for a in algorithms.ALGORITHMS if a.medium == "lines"]
LIMITS = planner.LineLimits(at_once=64 << 10, chunked_max=16 << 20, capacity=1 << 20)


def run(collective: str, name: str, size: int, count: int, root: int = 0, dtype=np.float32, **options):
    """Every rank's input and final buffers after running the entry's schedules numerically."""
    entry = algorithms.get(collective, name)
    schedules = [entry(rank, size, count, root=root, **options) for rank in range(size)]
    rng = np.random.default_rng([size, count])
    inputs = [(rng.standard_normal(count) * 10.0 ** rng.integers(-6, 7, count)).astype(dtype) for _ in range(size)]
    out = size * count if collective == "all_gather" else 0
    buffers = [{"data": x.copy(), "out": np.zeros(out, dtype), "tmp": np.zeros(s.tmp, dtype)}
               for x, s in zip(inputs, schedules)]
    walk(schedules, [{buf: len(a) for buf, a in b.items()} for b in buffers], Numeric(buffers, ReduceOp.SUM))
    return inputs, buffers


def test_the_lines_are_registered_where_they_run():
    assert sorted(ENTRIES) == sorted([(c, "lines") for c in lines.ONE_ROUND]
                                     + [(c, "chunked_lines") for c in lines.CHUNKED])
    for collective, name in ENTRIES:
        assert algorithms.get(collective, name).in_rank_order == collectives.get(collective).reduces


@pytest.mark.parametrize("name,options", [("lines", {}), ("chunked_lines", {"chunk": 5}),
                                          ("chunked_lines", {"chunk": 1000})])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_reductions_give_the_left_fold_in_rank_order(name, options, size):
    for count in (0, 1, 7, 37):
        for root in {0, size - 1}:
            inputs, buffers = run("reduce", name, size, count, root, **options)
            assert buffers[root]["data"].tobytes() == reduced(ReduceOp.SUM, inputs).tobytes()
            assert all(b["data"].tobytes() == x.tobytes() for r, (b, x) in enumerate(zip(buffers, inputs)) if r != root)
        inputs, buffers = run("all_reduce", name, size, count, **options)
        want = reduced(ReduceOp.SUM, inputs).tobytes()
        assert all(b["data"].tobytes() == want for b in buffers)


def test_the_left_fold_is_not_what_the_ring_gives():
    """The bits checked above depend on the order: the ring's differ."""
    inputs, buffers = run("all_reduce", "ring", 5, 37)
    assert buffers[0]["data"].tobytes() != reduced(ReduceOp.SUM, inputs).tobytes()


@pytest.mark.parametrize("size", [2, 4, 7])
def test_broadcast_and_all_gather_copy_what_the_lines_hold(size):
    inputs, buffers = run("broadcast", "lines", size, 9, root=size - 1)
    assert all(np.array_equal(b["data"], inputs[size - 1]) for b in buffers)
    inputs, buffers = run("all_gather", "lines", size, 9)
    assert all(np.array_equal(b["out"], np.concatenate(inputs)) for b in buffers)


@pytest.mark.parametrize("collective", lines.ONE_ROUND)
@pytest.mark.parametrize("size", [2, 5, 9])
def test_one_round_is_one_step_of_messages_with_every_reader(collective, size):
    """Every rank that writes sends to every rank that reads, all in step 0; later steps only copy."""
    readers = {"reduce": [0], "broadcast": list(range(1, size))}.get(collective, list(range(size)))
    writers = [0] if collective == "broadcast" else list(range(size))
    for rank in range(size):
        steps = algorithms.get(collective, "lines")(rank, size, 6).steps
        assert all(isinstance(op, Copy) for step in steps[1:] for op in step)
        sends = sorted(op.peer for op in steps[0] if isinstance(op, Send))
        recvs = sorted(op.peer for op in steps[0] if isinstance(op, Recv))
        assert sends == ([r for r in readers if r != rank] if rank in writers else [])
        assert recvs == ([w for w in writers if w != rank] if rank in readers else [])


@pytest.mark.parametrize("size", [2, 3, 8])
def test_chunks_are_cut_as_the_lines_cut_them(size):
    """Fixed chunks of ``chunk`` elements from the start (the last one shorter), two steps each, each
    step touching only its chunk of ``data``."""
    count, chunk = 23, 5
    for rank in range(size):
        steps = algorithms.get("all_reduce", "chunked_lines")(rank, size, count, chunk=chunk).steps
        assert len(steps) == 2 * -(-count // chunk)
        for s, step in enumerate(steps):
            low, high = s // 2 * chunk, min(count, (s // 2 + 1) * chunk)
            for op in step:
                for region in (getattr(op, f, None) for f in ("src", "dst", "reduce")):
                    if region is not None and region.buf == "data":
                        assert low <= region.start <= region.stop <= high


def test_the_chunk_is_a_line():
    options = ShmOptions()
    assert lines.LINE_BYTES == options.line_chunk
    assert algorithms.get("all_reduce", "chunked_lines").options["chunk"] == options.line_chunk // 4
    assert LIMITS.chunk(8) == (1 << 20) // 8
    assert planner.options("chunked_lines", 2, LIMITS) == {"chunk": 1 << 19}
    assert planner.options("lines", 2, LIMITS) == {} and planner.options("chunked_lines", 2, None) == {}


def test_a_round_costs_one_alpha_however_many_peers():
    alpha, beta, gamma = 1e-5, 1e-9, 1e-10
    for n in (2, 16, 64):
        assert lines.barrier_cost(n, 0, alpha, beta, gamma) == alpha
        assert lines.reduce_cost(n, 0, alpha, beta, gamma) == alpha
        assert lines.reduce_cost(n, 100, alpha, beta, gamma) == pytest.approx(alpha + (n - 1) * 100 * (beta + gamma))
        assert lines.broadcast_cost(n, 100, alpha, beta, gamma) == pytest.approx(alpha + 100 * beta)
    m = 5 * lines.LINE_BYTES + 1  # six chunks, two rounds each
    assert lines.chunked_cost(4, m, alpha, 0, 0) == pytest.approx(12 * alpha)
    assert lines.chunked_cost(4, m, alpha, 0, 0, chunk_bytes=m) == pytest.approx(2 * alpha)
    assert lines.chunked_cost(4, 8, alpha, beta, gamma) == pytest.approx(2 * alpha + 3 / 4 * 8 * (2 * beta + gamma))


def test_the_simulator_times_a_round_at_one_alpha():
    network = Network(Link(10e-6, 0.0), Link(10e-6, 0.0))
    assert simulate("all_reduce", "lines", 8, 8, network).time == pytest.approx(10e-6)
    assert simulate("barrier", "lines", 0, 16, network).time == pytest.approx(10e-6)
    long = simulate("all_reduce", "chunked_lines", 64 << 20, 4, network)  # 64 chunks of a line
    assert long.method == "extrapolated" and long.steps == 128 and long.time == pytest.approx(128 * 10e-6)


def test_the_profile_prices_the_lines_on_their_own_link():
    profile = costmodel.DEFAULT
    assert costmodel.transport_for("all_reduce", "lines", 1, "shm") == costmodel.LINES
    assert costmodel.transport_for("all_reduce", "lines", 2, "shm") == "shm"  # across hosts: the executor's
    assert costmodel.transport_for("all_reduce", "ring", 1, "shm") == "shm"
    assert profile.link(costmodel.LINES, "intra").alpha < profile.link("shm", "intra").alpha
    again = costmodel.from_json(profile.to_json())
    assert again.link(costmodel.LINES, "intra") == profile.link(costmodel.LINES, "intra")


# --- the planner's rule ---------------------------------------------------------------------------


def choose(collective, nbytes, size=4, requested=None, **kwargs):
    return planner.choose(collective, requested, nbytes, size, **{"lines": LIMITS, **kwargs})


@pytest.mark.parametrize("collective", lines.ONE_ROUND)
def test_one_round_up_to_at_once_bytes_per_rank(collective):
    assert choose(collective, 0) == "lines"  # nothing to write still takes the round
    assert choose(collective, 8) == "lines"
    assert choose(collective, LIMITS.at_once) == "lines"
    above = choose(collective, LIMITS.at_once + 1)
    assert above == ("chunked_lines" if collective in lines.CHUNKED else above)
    assert algorithms.get(collective, above).medium == ("lines" if collective in lines.CHUNKED else "any")


def test_the_per_rank_block_is_what_the_limit_compares():
    """An all-gather's ``nbytes`` is one rank's block, as the lines count it."""
    assert choose("all_gather", LIMITS.at_once, size=16) == "lines"
    assert choose("all_gather", LIMITS.at_once + 1, size=16) != "lines"


@pytest.mark.parametrize("collective", lines.CHUNKED)
def test_in_chunks_up_to_chunked_max_where_an_element_fits_a_line(collective):
    assert choose(collective, LIMITS.chunked_max) == "chunked_lines"
    assert algorithms.get(collective, choose(collective, LIMITS.chunked_max + 1)).medium == "any"
    tiny = planner.LineLimits(at_once=0, chunked_max=1 << 20, capacity=4)
    assert choose(collective, 0, lines=tiny) == "chunked_lines"  # no round at once: a call of nothing in chunks
    assert choose(collective, 16, lines=tiny, dtype=np.float32) == "chunked_lines"
    assert algorithms.get(collective, choose(collective, 16, lines=tiny, dtype=np.float64)).medium == "any"


def test_with_no_round_at_once_a_barrier_takes_the_schedules():
    assert choose("barrier", 0, lines=planner.LineLimits(0, 1 << 40, 1 << 20)) == "dissemination"


def test_a_named_or_forced_algorithm_wins_over_the_lines():
    assert choose("all_reduce", 8, requested="ring") == "ring"
    assert choose("all_reduce", 8, forced="ring") == "ring"
    # forced where the collective lacks it: the schedules by price, as the group skips the lines then
    assert algorithms.get("all_reduce", choose("all_reduce", 8, forced="pipeline")).medium == "any"
    assert planner.choose("all_reduce", "lines", 1 << 30, 4) == "lines"  # named: runs without lines too
    assert planner.choose("reduce", "chunked_lines", 8, 4, forced="binomial") == "chunked_lines"


def test_deterministic_mode_keeps_the_rule():
    assert choose("all_reduce", 8, in_rank_order=True) == "lines"
    assert choose("reduce", 1 << 20, in_rank_order=True) == "chunked_lines"
    assert choose("all_reduce", 1 << 30, in_rank_order=True) == "ordered"
    assert planner.choose("all_reduce", None, 8, 4, in_rank_order=True) == "ordered"


def test_other_collectives_ignore_the_lines():
    for collective in ("reduce_scatter", "all_to_all", "gather", "scatter"):
        assert algorithms.get(collective, choose(collective, 8)).medium == "any"


@pytest.mark.parametrize("collective", algorithms.COLLECTIVES)
def test_auto_without_lines_never_picks_them(collective):
    for size in (2, 3, 8):
        for nbytes in (0, 8, 1 << 16, 1 << 20, 64 << 20):
            for in_rank_order in (False, True):
                if in_rank_order and not collectives.get(collective).reduces:
                    continue
                name = planner.choose(collective, None, nbytes, size, in_rank_order=in_rank_order)
                assert algorithms.get(collective, name).medium == "any", (collective, size, nbytes, name)
    assert algorithms.get(collective, costmodel.best(collective, 8, 4, costmodel.DEFAULT.network())).medium == "any"
