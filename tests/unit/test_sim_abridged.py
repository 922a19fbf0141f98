"""The simulator's array-built traffic of pipelined trees against the traffic read from every rank's
schedule: the same steps and messages, and the same finishing time for every rank."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce import algorithms
from allreduce.model import traffic
from allreduce.model.network import Link, Network
from allreduce.sim import timing

TREES = [a.name for a in algorithms.ALGORITHMS if a.trees is not None]


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("n, hosts", [(2, 1), (5, 1), (8, 2), (12, 4), (13, 1), (48, 6)])
def test_tree_traffic_times_like_the_schedules(name, n, hosts):
    network = Network(Link(2e-5, 1e-9, 1.3), Link(5e-5, 4e-9, 1.1), 3e-10, 1e-10, hosts)
    for count, chunk in [(0, 50), (1, 50), (7, 3), (999, 7), (2500, 50)]:
        fast = traffic.extract("all_reduce", name, n, count, 4, hosts, chunk=chunk)
        full = traffic.extract("all_reduce", name, n, count, 4, hosts, full=True, chunk=chunk)
        assert (fast.steps, fast.messages) == (full.steps, full.messages), (count, chunk)
        assert np.allclose(timing.run(fast, network), timing.run(full, network), rtol=1e-12, atol=0), (count, chunk)


@pytest.mark.parametrize("name", ["ring", "ordered", "tree", "reduce_bcast", "rabenseifner"])
@pytest.mark.parametrize("n, hosts", [(4, 1), (7, 1), (12, 3), (16, 16)])
def test_runs_of_equal_steps_are_skipped_exactly(name, n, hosts):
    """The timing's skip over a run of equal steps, against stepping through every one of them (a
    step hook turns the skip off)."""
    network = Network(Link(2e-5, 1e-9, 1.4), Link(5e-5, 4e-9, 1.2), 3e-10, 1e-10, hosts, cores=2)
    for count in (1, 1000, 4096 + 3):
        flow = traffic.extract("all_reduce", name, n, count, 4, hosts, chunk=64) if name == "tree" else \
            traffic.extract("all_reduce", name, n, count, 4, hosts)
        skipped = timing.run(flow, network)
        stepped = timing.run(flow, network, lambda *_: None)
        assert np.allclose(skipped, stepped, rtol=1e-12, atol=0), count
