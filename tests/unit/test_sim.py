"""The simulator, without processes: closed forms it must reproduce, contention, the two-level topology,
its abridgements (cells, pipeline extrapolation) against the full step-by-step run, traces and the CLI."""

from __future__ import annotations

import json

import pytest

from allreduce import algorithms, cli
from allreduce.algorithms.schedule import Copy, Recv, Region, Schedule, Send
from allreduce.algorithms.verify import ScheduleError
from allreduce.cli.simulate import parse_per_byte, parse_seconds
from allreduce.model import traffic
from allreduce.model.network import Link, Network
from allreduce.sim import simulate, timing
from allreduce.sim.sweep import crossovers, sweep
from allreduce.trace import Trace

A, B, G, C = 10e-6, 1e-9, 0.5e-9, 0.2e-9  # alpha, beta, gamma, copy
A2, B2 = 50e-6, 8e-9  # the inter-host link


def net(duplex: float = 1.0, hosts: int = 1, inter_duplex: float = 1.0) -> Network:
    return Network(Link(A, B, duplex), Link(A2, B2, inter_duplex), gamma=G, copy=C, hosts=hosts)


def timed(schedules, size=None, hosts=1, network=None, itemsize=1) -> float:
    flow = traffic.from_schedules(schedules, size or len(schedules), itemsize, hosts)
    return float(timing.run(flow, network or net(hosts=hosts)).max())


def data(start, stop):
    return Region("data", start, stop)


# ---- closed forms ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 8, 12])
@pytest.mark.parametrize("duplex", [1.0, 1.6])
def test_ring_all_reduce_matches_its_closed_form(n, duplex):
    m = n * 1000 * 4  # bytes; chunks divide evenly
    chunk = m / n
    want = 2 * (n - 1) * (A + chunk * B * duplex) + (n - 1) * chunk * G
    assert simulate("all_reduce", "ring", m, n, net(duplex)).time == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_reduce_then_broadcast_matches_its_closed_form(n):
    m, rounds = 4096, n.bit_length() - 1
    want = 2 * rounds * (A + m * B) + rounds * m * G  # a rank only sends or only receives per round
    assert simulate("all_reduce", "reduce_bcast", m, n, net(1.7)).time == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_pairwise_all_to_all_matches_its_closed_form(n):
    block = 800
    want = block * C + (n - 1) * (A + block * B * 1.5)
    assert simulate("all_to_all", "pairwise", n * block, n, net(1.5)).time == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_recursive_doubling_matches_its_formula_on_powers_of_two(n):
    m = 4096
    want = algorithms.get("all_reduce", "recursive_doubling").cost(n, m, A, B, G)
    network = Network(Link(A, B), Link(A, B), gamma=G)  # no copy cost: the formula counts none
    assert simulate("all_reduce", "recursive_doubling", m, n, network).time == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n", [3, 4, 7, 16])
def test_pipelined_tree_settles_to_one_chunk_per_step(n):
    """Once full, a binary-tree pipeline adds one step per chunk: an interior rank's three sends."""
    chunk, network = 1000, Network(Link(A, B), Link(A, B), gamma=G)
    t = [simulate("all_reduce", "tree", k * chunk * 4, n, network, chunk=chunk).time for k in (40, 41)]
    per_step = A + (3 if n >= 5 else 2) * chunk * 4 * B + 2 * chunk * 4 * G  # rank 1 has two children from n = 5
    assert t[1] - t[0] == pytest.approx(per_step, rel=1e-9)


# ---- contention, duplex, hosts, reductions, waiting -----------------------------------------------------

def test_a_rank_sending_k_messages_shares_its_egress():
    k, nbytes = 3, 1000
    root = Schedule(((*[Send(q, data(0, nbytes)) for q in range(1, k + 1)],),))
    leaves = [Schedule(((Recv(0, data(0, nbytes)),),)) for _ in range(k)]
    assert timed([root, *leaves]) == pytest.approx(A + k * nbytes * B)


def test_k_senders_to_one_rank_share_its_ingress_and_it_reduces_one_at_a_time():
    k, nbytes = 3, 1000
    sink = Schedule(((*[Recv(q, data(q * nbytes, (q + 1) * nbytes), reduce=data(q * nbytes, (q + 1) * nbytes))
                        for q in range(1, k + 1)],),))
    senders = [Schedule(((Send(0, data(0, nbytes)),),)) for _ in range(k)]
    assert timed([sink, *senders], itemsize=1) == pytest.approx(A + k * nbytes * B + k * nbytes * G)


@pytest.mark.parametrize("duplex", [1.0, 1.5, 2.0])
def test_sending_and_receiving_at_once_costs_duplex(duplex):
    nbytes = 1000
    pair = [Schedule(((Send(1 - r, data(0, nbytes)), Recv(1 - r, data(nbytes, 2 * nbytes))),)) for r in range(2)]
    one_way = [Schedule(((Send(1, data(0, nbytes)),),)), Schedule(((Recv(0, data(0, nbytes)),),))]
    assert timed(pair, network=net(duplex)) == pytest.approx(A + nbytes * B * duplex)
    assert timed(one_way, network=net(duplex)) == pytest.approx(A + nbytes * B)


def test_ranks_of_one_host_share_its_nic():
    """Hosts {0, 1} and {2, 3}: ranks 0 and 1 both send across at once; 1 also sends to 0 inside."""
    nbytes = 1000
    s = [Schedule(((Send(2, data(0, nbytes)), Recv(1, data(nbytes, 2 * nbytes))),)),
         Schedule(((Send(3, data(0, nbytes)), Send(0, data(0, nbytes))),)),
         Schedule(((Recv(0, data(0, nbytes)),),)), Schedule(((Recv(1, data(0, nbytes)),),))]
    flow = traffic.from_schedules(s, 4, 1, hosts=2)
    assert list(flow.inter) == [False, True, True]  # read on the receiving side: ranks 0, 2, 3
    ends = []
    finish = timing.run(flow, net(hosts=2), lambda step, t0, end, done: ends.extend(end))
    inter = A2 + 2 * nbytes * B2  # both crossings share host 0's NIC and host 1's
    assert ends == pytest.approx([A + nbytes * B, inter, inter])  # the intra message has its own port
    assert finish == pytest.approx([inter] * 4)


def test_a_message_waits_for_its_receiver_and_copies_delay_their_rank():
    nbytes = 1000
    s = [Schedule(((Copy(data(0, nbytes), data(nbytes, 2 * nbytes)),), (Send(1, data(0, nbytes)),))),
         Schedule(((), (Recv(0, data(0, nbytes)),)))]
    assert timed(s) == pytest.approx(nbytes * C + A + nbytes * B)


def test_mismatched_sends_and_receives_are_refused():
    s = [Schedule(((Send(1, data(0, 10)),),)), Schedule(((Recv(0, data(0, 9)),),))]
    with pytest.raises(ScheduleError, match="disagree"):
        traffic.from_schedules(s, 2, 1)


def test_ranks_beyond_the_cores_take_turns_but_the_nic_does_not():
    crowded = Network(Link(A, B), Link(A2, B2), gamma=G, hosts=2, cores=2)  # 4 ranks per host
    m = 8 * 4000
    slow = simulate("all_reduce", "ring", m, 8, crowded).time
    want = 2 * 7 * (2 * A2 + m / 8 * B2) + 7 * m / 8 * 2 * G  # inter-host beta is not stretched
    assert slow == pytest.approx(want, rel=1e-9)
    assert crowded.stretch(8) == 2.0 and crowded.stretch(4) == 1.0


@pytest.mark.parametrize("name, steps", [("ring", 6), ("direct", 2), ("recursive_doubling", 2)])
def test_a_step_costs_once_however_many_messages_it_has(name, steps):
    stepping = Network(Link(A, B, step=3e-5), Link(A2, B2), gamma=G, copy=C)
    extra = simulate("all_reduce", name, 4096, 4, stepping).time - simulate("all_reduce", name, 4096, 4, net()).time
    assert extra == pytest.approx(steps * 3e-5, rel=1e-9)


def test_crowded_ranks_stretch_alpha_and_step_by_their_measured_share():
    crowded = Network(Link(A, B, step=2e-5, crowded=0.5), Link(A2, B2), gamma=G, cores=2)  # 4 ranks: 2x
    m = 4 * 4000
    want = 2 * 3 * (0.5 * 2 * (A + 2e-5) + m / 4 * 2 * B) + 3 * m / 4 * 2 * G  # beta, gamma: all of the 2x
    assert simulate("all_reduce", "ring", m, 4, crowded).time == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match="crowded"):
        Link(A, B, crowded=0.0)


def test_only_the_busy_ranks_of_a_step_share_the_cores():
    # reduce_bcast on 4 ranks: its first reduce and last broadcast step keep all 4 busy, the other two 2
    crowded = Network(Link(A, B), Link(A2, B2), gamma=G, cores=2)
    m = 4096
    want = 2 * (2 * A + m * 2 * B) + 2 * (A + m * B) + m * 2 * G + m * G
    assert simulate("all_reduce", "reduce_bcast", m, 4, crowded).time == pytest.approx(want, rel=1e-9)
    flow = traffic.extract("all_reduce", "reduce_bcast", 4, m, 1)
    assert flow.busy().tolist() == [4, 2, 2, 4]


def test_hosts_must_divide_the_world():
    with pytest.raises(ValueError, match="evenly"):
        simulate("all_reduce", "ring", 1024, 6, net(hosts=4))


def test_an_inter_host_ring_is_paced_by_the_nic_link():
    n, hosts, m = 8, 4, 8 * 4000
    want = 2 * (n - 1) * (A2 + m / n * B2) + (n - 1) * m / n * G  # one crossing per host per step
    assert simulate("all_reduce", "ring", m, n, net(hosts=hosts)).time == pytest.approx(want, rel=1e-9)


# ---- abridged runs against the full run---------------------------------------------------------

@pytest.mark.parametrize("entry", [(a.collective, a.name) for a in algorithms.ALGORITHMS if a.shift_invariant])
@pytest.mark.parametrize("n, hosts", [(4, 1), (6, 3), (8, 2), (12, 4), (12, 12), (13, 1), (48, 6)])
def test_a_cell_times_like_the_whole_world(entry, n, hosts):
    collective, name = entry
    count = n * 30
    network = net(1.4, hosts, 1.2)
    cell = timing.run(traffic.extract(collective, name, n, count, 4, hosts), network)
    full = timing.run(traffic.extract(collective, name, n, count, 4, hosts, full=True), network)
    assert cell.size < n or n == hosts
    assert cell.max() == pytest.approx(full.max(), rel=1e-12)


PIPELINES = [(a.collective, a.name) for a in algorithms.ALGORITHMS if "chunk" in a.options]
ON_LINES = [(a.collective, a.name) for a in algorithms.ALGORITHMS if a.medium == "lines"]


@pytest.mark.parametrize("collective, name, n, hosts",
                         [(*entry, n, hosts) for entry in PIPELINES for n, hosts in [(2, 1), (5, 1), (8, 2), (13, 1)]
                          if hosts == 1 or entry not in ON_LINES])
@pytest.mark.parametrize("chunks", [50, 80, 200])
def test_long_pipelines_extrapolate_exactly(collective, name, n, hosts, chunks):
    chunk = 50
    network = net(1.3, hosts)
    predicted = simulate(collective, name, chunks * chunk * 4, n, network, chunk=chunk)
    assert predicted.method == "extrapolated"
    flow = traffic.extract(collective, name, n, chunks * chunk, 4, hosts, chunk=chunk)
    assert predicted.time == pytest.approx(timing.run(flow, network).max(), rel=1e-9)
    assert predicted.steps == flow.steps


@pytest.mark.parametrize("collective, name", PIPELINES)
@pytest.mark.parametrize("count", [49 * 50 + 1, 131 * 50 - 7])
def test_long_pipelines_of_uneven_chunks_extrapolate_closely(collective, name, count):
    """Chunks of unequal length (or, for the double tree, an odd number of them) are priced at the
    average length: within a step's worth of the full run."""
    network = net(1.3)
    predicted = simulate(collective, name, count * 4, 8, network, chunk=50)
    full = timing.run(traffic.extract(collective, name, 8, count, 4, 1, chunk=50), network).max()
    assert predicted.time == pytest.approx(full, rel=0.02)


def test_tiny_rings_round_their_count_up():
    """A cell needs equal chunks: 2 elements on 16 ranks are timed as 16, latency either way."""
    result = simulate("all_reduce", "ring", 8, 16, net())
    assert result.count == 2 and result.method == "cell"
    assert result.time == pytest.approx(30 * (A + 4 * B) + 15 * 4 * G)


@pytest.mark.parametrize("name", algorithms.anywhere("all_reduce", algorithms.names("all_reduce")))
def test_every_all_reduce_runs_on_1024_ranks(name):
    result = simulate("all_reduce", name, 1 << 20, 1024, net(1.5, hosts=128))
    assert result.time > 0 and result.steps > 0


@pytest.mark.parametrize("collective, name", ON_LINES)
def test_the_lines_across_hosts_are_refused_with_the_reason(collective, name):
    """The shared-memory lines are one host's: across hosts they are refused, never priced."""
    with pytest.raises(ValueError, match=f"{name}' runs on the shared-memory lines.*cannot run across 2 hosts"):
        simulate(collective, name, 1 << 20, 8, net(hosts=2))
    assert simulate(collective, name, 1 << 20, 8, net()).time > 0  # on one host they run


def test_the_simulate_command_refuses_the_lines_across_hosts(capsys):
    assert cli.main(["simulate", "--size", "1MiB", "-n", "16", "--hosts", "2"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0] for line in out.splitlines() if not line.startswith("#")}
    assert "ring" in rows and not rows & {"lines", "chunked_lines"}
    assert "# chunked_lines refused: all_reduce algorithm 'chunked_lines' runs on the shared-memory lines" in out
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--algo", "lines", "-n", "16", "--hosts", "2"])
    assert "cannot run across 2 hosts" in capsys.readouterr().err


@pytest.mark.parametrize("chunk", [64, 100])  # pieces of a chunk equal on every rank, and not
def test_chunked_lines_are_timed_on_a_cell(chunk):
    network = net(1.4)
    cell = traffic.extract("all_reduce", "chunked_lines", 16, 7 * chunk + 20, 4, chunk=chunk)
    full = traffic.extract("all_reduce", "chunked_lines", 16, 7 * chunk + 20, 4, full=True, chunk=chunk)
    assert cell.ranks == 1 and cell.steps == full.steps == 16
    assert timing.run(cell, network).max() == pytest.approx(timing.run(full, network).max(), rel=1e-12)


def test_chunked_lines_traffic_grows_linearly_in_ranks_times_chunks():
    """One rank's schedule, and the messages read from it, per rank and chunk: twice the ranks, twice the rows."""
    rows = {n: len(traffic.extract("all_reduce", "chunked_lines", n, 48 * 64 * n, 4, chunk=64 * n).src)
            for n in (64, 128)}
    assert rows == {64: 48 * 2 * 63, 128: 48 * 2 * 127}


def test_sweep_finds_the_crossover_between_latency_and_bandwidth_algorithms():
    table = sweep("all_reduce", ["reduce_bcast", "ring"], [2**k for k in range(6, 25, 2)], 8, net())
    [cross] = crossovers(table)
    assert (cross.before, cross.after) == ("reduce_bcast", "ring")
    sizes = [r.nbytes for r in table["ring"]]
    i = next(i for i, nbytes in enumerate(sizes) if nbytes > cross.nbytes)
    assert table["ring"][i].time < table["reduce_bcast"][i].time
    assert table["ring"][i - 1].time >= table["reduce_bcast"][i - 1].time


def test_the_simulated_trace_has_steps_messages_and_reductions(tmp_path):
    trace = Trace(source="test")
    simulate("all_reduce", "ring", 4 * 1024, 4, net(hosts=2), trace=trace, trace_ranks=2)  # a cell of 2 ranks
    path = tmp_path / "sim.json"
    trace.write(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {(0, "collective"), (0, "step"), (0, "send -> 1"), (0, "recv <- 3"), (0, "reduce"),
            (1, "send -> 2")} <= lanes
    steps = [e for e in events if e["ph"] == "X" and e["tid"] == 1 and e["pid"] == 0]
    assert len(steps) == 6 and all(e["dur"] > 0 for e in steps)
    assert {e["pid"] for e in events} == {0, 1}


@pytest.mark.parametrize("text, seconds", [("25us", 25e-6), ("0.1ms", 1e-4), ("2e-5", 2e-5), ("1s", 1.0)])
def test_parse_seconds(text, seconds):
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, per_byte", [("1e-9", 1e-9), ("8Gbit/s", 1e-9), ("1.25GB/s", 0.8e-9), ("500MB/s", 2e-9)])
def test_parse_per_byte(text, per_byte):
    assert parse_per_byte(text) == pytest.approx(per_byte)


def test_parse_rejects_nonsense():
    with pytest.raises(ValueError):
        parse_seconds("fast")
    with pytest.raises(ValueError):
        parse_per_byte("10 furlongs")


def test_simulate_command(capsys, tmp_path):
    trace = tmp_path / "t.json"
    assert cli.main(["simulate", "--algo", "ring", "--size", "1MiB", "-n", "64", "--hosts", "8", "--alpha", "20us",
                     "--beta", "10Gbit/s", "--timeline", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "ring" in out and "cell" in out
    assert json.loads(trace.read_text())["traceEvents"]
    sweep = ["simulate", "-n", "8", "--sweep", "--size", "1M", "--algo", "ring,reduce_bcast", "--cores", "8"]
    assert cli.main(sweep) == 0
    assert "crossover" in capsys.readouterr().out


def test_simulate_command_refuses_a_timeline_of_a_sweep():
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--sweep", "--timeline", "x.json"])
