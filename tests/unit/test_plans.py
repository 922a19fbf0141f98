"""A call shape's plan (``planner/plans.py``): a pure function of the shape, the group's site and the
cost profile, whose result names the algorithm, its options and digest, and the engine that runs it."""

from __future__ import annotations

import numpy as np

from allreduce import algorithms, wire
from allreduce.algorithms import tree
from allreduce.ops import ReduceOp
from allreduce.planner import LineLimits, plans
from allreduce.settings import Settings
from allreduce.topology import from_host_ids

LIMITS = LineLimits(at_once=64 << 10, chunked_max=16 << 20, capacity=1 << 20)
F32 = np.dtype(np.float32)


def site(hosts=("a", "a", "b", "b"), intra="tcp", lines=None, **settings) -> plans.Site:
    return plans.Site(from_host_ids(0, list(hosts)), intra, Settings(**settings), lines)


def plan(where: plans.Site, collective="all_reduce", count=1 << 20, requested=None, dtype=F32, op=ReduceOp.SUM,
         deterministic=False) -> plans.ShapePlan:
    return plans.plan(where, collective, requested, count, np.dtype(dtype), op, deterministic)


def test_a_plan_is_the_same_for_the_same_shape_on_every_rank():
    one, other = site(), plans.Site(from_host_ids(3, ["a", "a", "b", "b"]), "tcp", Settings(), None)
    assert plan(one) == plan(other) == plan(one)


def test_several_hosts_of_several_ranks_all_reduce_hierarchically_unless_told_otherwise():
    where = site()
    shaped = plan(where)
    assert shaped.algorithm == "hierarchical" and shaped.engine == "schedules"
    assert shaped.options == {"hosts": ((0, 1), (2, 3))}
    assert plan(where, requested="ring").algorithm == "ring"
    assert plan(site(algorithm="direct")).algorithm == "direct"
    assert algorithms.get("all_reduce", plan(where, deterministic=True).algorithm).in_rank_order
    assert plan(where, collective="reduce").algorithm != "hierarchical"
    for uneven in (("a", "a", "b"), ("a", "b", "c"), ("a",) * 4):
        assert plan(site(uneven)).algorithm != "hierarchical"


def test_deterministic_mode_restricts_only_the_reductions_whose_bits_depend_on_order():
    where = site(("a",) * 4)
    assert plan(where, deterministic=True).algorithm == "ordered"
    assert plan(where, deterministic=True, op=ReduceOp.MAX).algorithm == plan(where, op=ReduceOp.MAX).algorithm
    assert plan(where, deterministic=True, dtype=np.int64).algorithm == plan(where, dtype=np.int64).algorithm
    assert plan(where, "broadcast", deterministic=True).algorithm == plan(where, "broadcast").algorithm


def test_the_lines_engine_runs_the_lines_algorithms_where_the_group_has_lines():
    where = site(("a",) * 4, "shm", LIMITS)
    assert (plan(where, count=4).algorithm, plan(where, count=4).engine) == ("lines", "lines")
    assert (plan(where).algorithm, plan(where).engine) == ("chunked_lines", "lines")
    assert plan(where, count=1 << 30).engine == "schedules"
    named = plan(site(("a",) * 4), count=4, requested="lines")  # named without lines: the schedules run it
    assert (named.algorithm, named.engine) == ("lines", "schedules")


def test_the_digest_is_the_sites_and_names_the_algorithm_with_its_options():
    where = site()
    shaped = plan(where, requested="tree")
    assert (dict(shaped.options), shaped.digest) == where.digests[algorithms.get("all_reduce", "tree")]
    assert wire.algorithm_label(shaped.digest) == f"tree(chunk={tree.DEFAULT_CHUNK})"
    assert plan(where).digest != plan(site(("a", "b", "a", "b"))).digest  # other hosts: another schedule
    assert plan(where, requested="tree").digest == plan(site(("a", "b", "a", "b")), requested="tree").digest


def test_algorithm_for_is_the_plans_algorithm():
    where = site(("a",) * 4, "shm", LIMITS)
    for count in (0, 4, 1 << 20, 1 << 30):
        assert plans.algorithm_for(where, "all_reduce", None, count * 4, F32) == plan(where, count=count).algorithm
