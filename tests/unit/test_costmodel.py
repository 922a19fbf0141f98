"""The cost profile, the predictions, the planner's choice, and the tuner's arithmetic (pure), plus one
short ``allreduce tune`` and ``allreduce plan`` run."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from allreduce import algorithms, cli, planner
from allreduce.cli import tune
from allreduce.model.network import Link, Network
from allreduce.planner import costmodel

SLOW_START = {"links": {"tcp": {"intra": {"alpha": 1e-3, "beta": 1e-9}}}}  # latency dominates up to ~MBs
FAST_START = {"links": {"tcp": {"intra": {"alpha": 1e-7, "beta": 1e-8}}}}  # bandwidth dominates


@pytest.fixture(autouse=True)
def no_outside_profile(monkeypatch, tmp_path):
    """Every test sees an empty cache (the default, under the home directory) and no profile or algorithm
    from the environment."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("ALLREDUCE_PROFILE", "ALLREDUCE_ALGO"):
        monkeypatch.delenv(name, raising=False)


def write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


# ---- the profile --------------------------------------------------------------------------------

def test_without_a_file_the_defaults_hold(tmp_path):
    assert costmodel.load() is costmodel.DEFAULT
    assert costmodel.default_path() == str(tmp_path / ".cache" / "allreduce" / "profile.json")
    assert costmodel.default_path("/c") == "/c/allreduce/profile.json"
    path = costmodel.default_path(str(tmp_path / "xdg"))
    costmodel.save(costmodel.DEFAULT.updated(cores=3), path)
    assert costmodel.load(cache_home=str(tmp_path / "xdg")).cores == 3


def test_a_partial_file_overrides_only_what_it_names(tmp_path):
    profile = costmodel.load(write(tmp_path, {"links": {"tcp": {"inter": {"alpha": 1e-4, "beta": 2e-9}}},
                                              "gamma": {"float64": 3e-10}}))
    assert profile.link("tcp", "inter") == Link(1e-4, 2e-9)
    assert profile.link("tcp", "intra") == costmodel.DEFAULT.link("tcp", "intra")
    assert profile.gamma_for("float64") == 3e-10
    assert profile.gamma_for("int8") == costmodel.DEFAULT.gamma_for("float32")  # not listed: float32's


def test_a_profile_round_trips_through_json(tmp_path):
    profile = costmodel.DEFAULT.updated({("shm", "intra"): Link(2e-6, 1e-10, 1.3)}, {"int32": 1e-10}, 5e-11, "box", 7)
    path = str(tmp_path / "sub" / "p.json")
    costmodel.save(profile, path)
    again = costmodel.load(path)
    assert (again.links, again.gamma, again.copy, again.machine, again.cores) == \
        (profile.links, profile.gamma, profile.copy, "box", 7)
    assert again.source == path


def test_a_transport_without_its_own_figures_falls_back_to_tcp():
    tcp_only = costmodel.Profile(((("tcp", "intra", Link(1e-5, 1e-9))),), (("float32", 1e-10),), 0.0)
    assert tcp_only.link("shm", "intra") == Link(1e-5, 1e-9)
    assert costmodel.DEFAULT.link("shm", "inter") == costmodel.DEFAULT.link("tcp", "inter")


def test_a_named_profile_is_read_and_a_missing_one_is_an_error(tmp_path):
    assert costmodel.load(write(tmp_path, SLOW_START)).link("tcp", "intra").alpha == 1e-3
    with pytest.raises(ValueError, match="allreduce tune"):
        costmodel.load(str(tmp_path / "nope.json"))


@pytest.mark.parametrize("data", ["{", json.dumps({"links": {"tcp": {"intra": {"alpha": 1}}}}),
                                  json.dumps({"links": {"udp": {"intra": {"alpha": 1, "beta": 1}}}}),
                                  json.dumps({"format": 99})])
def test_a_malformed_profile_says_so(tmp_path, data):
    path = tmp_path / "bad.json"
    path.write_text(data)
    with pytest.raises(ValueError, match="bad.json"):
        costmodel.load(str(path))


# ---- predictions ------------------------------------------------------------------------------------

def test_one_host_prices_the_formula_on_the_intra_link():
    network = Network(Link(1e-5, 1e-9, 1.5), Link(1e-4, 1e-8), gamma=2e-10)
    want = algorithms.get("all_reduce", "ring").cost(8, 2**20, 1e-5, 1.5e-9, 2e-10)
    assert costmodel.predict("all_reduce", "ring", 2**20, 8, network) == pytest.approx(want)


def test_one_rank_per_host_prices_the_inter_link():
    network = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8, 1.2), gamma=0.0, hosts=8)
    want = algorithms.get("all_reduce", "ring").cost(8, 2**20, 1e-4, 1.2e-8, 0.0)
    assert costmodel.predict("all_reduce", "ring", 2**20, 8, network) == pytest.approx(want)


def test_the_nic_share_comes_from_the_schedules():
    assert costmodel.nic_share("all_reduce", "ring", 16, 4) == 1  # one crossing per host and step
    assert costmodel.nic_share("all_reduce", "recursive_doubling", 16, 4) == 4  # the whole host at once
    network = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), hosts=4)
    assert costmodel.effective_link("all_reduce", "recursive_doubling", 16, network) == (1e-4, 4e-8)


def test_split_collectives_are_priced_on_the_whole_buffer():
    network = Network(Link(1e-5, 1e-9, 1.5), Link(1e-4, 1e-8), gamma=2e-10)
    alpha, beta = costmodel.effective_link("all_gather", "ring", 4, network)
    want = algorithms.get("all_gather", "ring").cost(4, 4096, alpha, beta, network.gamma)
    assert costmodel.predict("all_gather", "ring", 4096, 4, network) == pytest.approx(want)


def test_local_copies_are_added_to_the_formula():
    assert costmodel.copy_share("all_reduce", "ring", 4) == 0.0
    assert costmodel.copy_share("all_reduce", "recursive_doubling", 2) == 1.0  # the running sum goes to tmp
    plain = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10)
    copying = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10, copy=3e-10)
    extra = costmodel.predict("all_reduce", "recursive_doubling", 2**20, 2, copying) - \
        costmodel.predict("all_reduce", "recursive_doubling", 2**20, 2, plain)
    assert extra == pytest.approx(2**20 * 3e-10)


def test_more_ranks_than_cores_stretch_the_cpu_bound_costs():
    roomy = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10)
    crowded = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10, cores=2)
    t = [costmodel.predict("all_reduce", "ring", 2**20, n, network) for n in (2, 4) for network in (roomy, crowded)]
    assert t[0] == t[1] and t[3] == pytest.approx(2 * t[2])


@pytest.mark.parametrize("name", ["ring", "direct", "recursive_doubling", "rabenseifner"])
def test_each_step_adds_the_links_step_cost_as_the_simulator_does(name):
    from allreduce.sim import simulate

    plain = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10)
    stepping = Network(Link(1e-5, 1e-9, step=4e-5), Link(1e-4, 1e-8), gamma=1e-10)
    extra = (costmodel.predict("all_reduce", name, 4096, 4, stepping)
             - costmodel.predict("all_reduce", name, 4096, 4, plain))
    simulated = simulate("all_reduce", name, 4096, 4, stepping).time - simulate("all_reduce", name, 4096, 4, plain).time
    assert extra == pytest.approx(4e-5 * costmodel.step_count("all_reduce", name, 4, 1024)) == pytest.approx(simulated)


def test_a_pipeline_pays_the_step_cost_with_each_chunk():
    plain = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10)
    stepping = Network(Link(1e-5, 1e-9, step=4e-5), Link(1e-4, 1e-8), gamma=1e-10)
    folded = Network(Link(5e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10)
    assert costmodel.predict("all_reduce", "double_tree", 2**22, 8, stepping) == \
        pytest.approx(costmodel.predict("all_reduce", "double_tree", 2**22, 8, folded))
    assert costmodel.predict("all_reduce", "double_tree", 2**22, 8, stepping) > \
        costmodel.predict("all_reduce", "double_tree", 2**22, 8, plain)


def test_crowded_ranks_favour_algorithms_that_leave_ranks_idle():
    crowded = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), gamma=1e-10, cores=2)
    assert costmodel.crowding("all_reduce", "ring", 4, crowded) == (2.0, 2.0)
    assert costmodel.crowding("all_reduce", "reduce_bcast", 4, crowded) == (1.5, 1.5)  # busy 4, 2, 2, 4
    roomy = dataclasses.replace(crowded, cores=0)
    slower = [costmodel.predict("all_reduce", name, 2**20, 4, crowded)
              / costmodel.predict("all_reduce", name, 2**20, 4, roomy) for name in ("ring", "reduce_bcast")]
    assert slower[0] == pytest.approx(2.0) and slower[1] == pytest.approx(1.5)


def test_a_single_rank_costs_nothing():
    assert costmodel.predict("all_reduce", "ring", 2**20, 1, costmodel.DEFAULT.network()) == 0.0


# ---- the planner ------------------------------------------------------------------------------

def test_auto_follows_the_profile(tmp_path):
    latency_bound = planner.choose("all_reduce", "auto", 4096, 8, profile=write(tmp_path, SLOW_START))
    bandwidth_bound = planner.choose("all_reduce", None, 4096, 8, profile=write(tmp_path, FAST_START, "fast.json"))
    assert latency_bound != bandwidth_bound
    network = lambda data: costmodel.from_json(data).network()  # noqa: E731
    t = {name: costmodel.predict("all_reduce", name, 4096, 8, network(SLOW_START))
         for name in algorithms.anywhere("all_reduce", algorithms.names("all_reduce"))}
    assert latency_bound == min(t, key=t.get)


def test_auto_picks_a_bandwidth_algorithm_for_large_messages_and_few_rounds_for_small(tmp_path):
    roomy = write(tmp_path, {"cores": 64})  # a rank per core, whatever this machine has
    small = planner.choose("all_reduce", "auto", 8, 16, profile=roomy)
    large = planner.choose("all_reduce", "auto", 256 << 20, 16, profile=roomy)
    rounds = {name: len(algorithms.get("all_reduce", name)(0, 16, 16).steps) for name in (small, large)}
    assert rounds[small] < rounds[large]


def test_an_explicit_algorithm_or_the_forced_one_wins():
    assert planner.choose("all_reduce", "tree", 8, 4, forced="ring") == "tree"
    assert planner.choose("all_reduce", "auto", 8, 4, forced="ring") == "ring"
    assert planner.choose("broadcast", "auto", 8, 4, forced="ring") in algorithms.names("broadcast")  # no ring there
    with pytest.raises(ValueError, match="known"):
        planner.choose("all_reduce", "nope", 8, 4)


def test_hosts_of_unequal_size_are_priced_as_if_the_fullest_crossed_at_once():
    network = Network(Link(1e-5, 1e-9), Link(1e-4, 1e-8), hosts=2)
    assert costmodel.effective_link("all_reduce", "ring", 3, network) == (1e-4, 2e-8)
    assert planner.choose("all_reduce", "auto", 1 << 20, 3, hosts=2) in algorithms.names("all_reduce")


# ---- the tuner's arithmetic -------------------------------------------------------------------------

def test_fit_link_recovers_alpha_beta_and_duplex():
    alpha, beta, copy, duplex = 3e-5, 2e-10, 1e-10, 1.6
    ping = [m * beta + 1e-5 for m in tune.PING_SIZES]  # an offset does not change the slope
    exchange = [alpha + m * (copy + beta * duplex) for m in tune.EXCHANGE_SIZES]
    link = tune.fit_link(tune.PING_SIZES, ping, tune.EXCHANGE_SIZES, exchange, copy)
    assert (link.alpha, link.beta, link.duplex) == pytest.approx((alpha, beta, duplex), rel=1e-2)


def test_duplex_stays_between_one_and_two():
    ping = [m * 2e-10 for m in tune.PING_SIZES]
    fast = tune.fit_link(tune.PING_SIZES, ping, tune.EXCHANGE_SIZES, [1e-9] * len(tune.EXCHANGE_SIZES), 0.0)
    slow = tune.fit_link(tune.PING_SIZES, ping, tune.EXCHANGE_SIZES, [m * 1e-9 for m in tune.EXCHANGE_SIZES], 0.0)
    assert (fast.duplex, slow.duplex) == (1.0, 2.0)


def test_ranks_that_take_turns_do_not_pay_duplex():
    half = Network(Link(1e-5, 1e-9, 2.0), Link(1e-4, 1e-8), gamma=1e-10)
    full = Network(Link(1e-5, 1e-9, 1.0), Link(1e-4, 1e-8), gamma=1e-10)
    assert not costmodel.exchanges("all_reduce", "reduce_bcast", 4) and costmodel.exchanges("all_reduce", "ring", 4)
    same = [costmodel.predict("all_reduce", "reduce_bcast", 2**20, 4, network) for network in (half, full)]
    assert same[0] == same[1]
    ring = [costmodel.predict("all_reduce", "ring", 2**20, 4, network) for network in (half, full)]
    assert ring[0] > ring[1]


@pytest.mark.parametrize("cores", [2, 8])
def test_fit_step_recovers_the_per_step_cost_and_the_crowded_share(cores):
    step, message, share = 1.2e-4, 0.6e-4, 0.7
    truth = Link(message, 1e-9, step=step, crowded=share if cores < tune.STEP_RANKS else 1.0)
    network = Network(truth, truth, cores=cores)
    seconds = {name: costmodel.predict("all_reduce", name, tune.PROBE_BYTES, tune.STEP_RANKS, network, 1)
               for name in tune.STEP_PROBES}
    fitted = tune.fit_step(Link(step + message, 1e-9), seconds, tune.STEP_RANKS, cores)
    # the fit leaves out the probe's 8 bytes of beta and gamma
    assert ((fitted.alpha, fitted.step, fitted.crowded)
            == pytest.approx((truth.alpha, truth.step, truth.crowded), rel=1e-3))


def test_a_profile_keeps_step_and_crowded(tmp_path):
    profile = costmodel.DEFAULT.updated({("shm", "intra"): Link(2e-6, 1e-10, 1.3, step=3e-6, crowded=0.6)})
    costmodel.save(profile, str(tmp_path / "p.json"))
    assert costmodel.load(str(tmp_path / "p.json")).link("shm", "intra") == Link(2e-6, 1e-10, 1.3, 3e-6, 0.6)


def test_fit_link_needs_small_and_large_sizes():
    with pytest.raises(ValueError):
        tune.fit_link([8, 16], [1.0, 2.0], [8], [1.0], 0.0)


# ---- the commands ----------------------------------------------------------------------------------------

def test_plan_prints_every_algorithm_and_the_choice(capsys, tmp_path):
    assert cli.main(["plan", "--size", "64MiB", "-n", "16", "--hosts", "4", "--simulate",
                     "--profile", write(tmp_path, FAST_START)]) == 0
    out = capsys.readouterr().out
    for name in algorithms.names("all_reduce"):
        assert name in out
    choice = next(line for line in out.splitlines() if line.startswith("# auto runs:")).split()[3]
    assert choice in algorithms.names("all_reduce")


def test_tune_measures_and_stores_a_profile(tmp_path):
    path = tmp_path / "tuned.json"
    done = subprocess.run([sys.executable, "-m", "allreduce", "tune", "--transport", "tcp", "--rounds", "1",
                           "--output", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    profile = costmodel.load(str(path))
    link = profile.link("tcp", "intra")
    assert 0 < link.alpha + link.step < 0.01 and 0 < link.beta < 1e-7 and 1 <= link.duplex <= 2
    assert 0.25 <= link.crowded <= 4
    assert profile.gamma_for("float64") > 0 and "cpus" in profile.machine
    assert "tcp intra-host" in done.stdout and "per step" in done.stdout


def test_plan_explains_its_choice_in_one_line(capsys, monkeypatch):
    assert cli.main(["plan", "--size", "8", "-n", "4", "--cores", "0"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("# auto runs: lines (") and "per-message latency" in line and ".py" not in line
    assert cli.main(["plan", "--size", "256MiB", "-n", "4", "--cores", "0"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("# auto runs: chunked_lines (") and "moving and reducing bytes" in line
    assert cli.main(["plan", "--size", "16MiB", "-n", "4", "--deterministic"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("# auto runs: chunked_lines (")  # in rank order
    monkeypatch.setenv("ALLREDUCE_SHM_CHUNKED_MAX", "0")  # no lines in chunks: the schedules
    assert cli.main(["plan", "--size", "256MiB", "-n", "4", "--cores", "0"]) == 0
    assert "moving and reducing bytes" in capsys.readouterr().out.splitlines()[-1]
    assert cli.main(["plan", "--size", "16MiB", "-n", "4", "--deterministic"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("# auto runs: ordered (")
    assert cli.main(["plan", "--size", "16MiB", "-n", "8", "--hosts", "2"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("# auto runs: hierarchical (") and "across the 2 hosts" in line


def test_explain_names_the_runner_up_and_how_much_slower_it_is():
    network = costmodel.DEFAULT.network()
    line = costmodel.explain("all_reduce", 1 << 20, 4, network)
    choice = costmodel.best("all_reduce", 1 << 20, 4, network)
    assert line.startswith(f"{choice} (") and ("faster than" in line or "as fast as" in line)
    assert costmodel.explain("all_reduce", 1 << 20, 4, network, candidates=("ordered",)).startswith("ordered (")
