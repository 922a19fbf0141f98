"""``ALLREDUCE_TIMELINE``: two real ranks write one Chrome trace each, with a span per collective, step,
message and reduction; and the pure pieces (file names, merging) without processes."""

from __future__ import annotations

import json

import numpy as np

from allreduce import algorithms
from allreduce.timeline import timeline_path
from allreduce.trace import Trace, merge
from support.harness import run_ranks

COUNT = 1 << 18  # elements: large enough that reductions show while segments arrive


def _collectives(rank, size):
    import allreduce as dist

    x = np.ones(COUNT, np.float32)
    dist.all_reduce(x, algorithm="ring")
    dist.all_reduce(x, algorithm="tree")
    dist.broadcast(np.ones(8, np.float32), 0)
    return float(x[0])


def _spans(events, pid):
    lanes = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == pid}
    return [(lanes[e["tid"]], e) for e in events if e["ph"] == "X" and e["pid"] == pid]


def test_two_ranks_write_a_trace_each(tmp_path):
    base = tmp_path / "run.json"
    assert run_ranks(_collectives, 2, env={"ALLREDUCE_TIMELINE": str(base)}) == [4.0, 4.0]
    for rank in range(2):
        trace = json.loads((tmp_path / f"run.rank{rank}.json").read_text())
        spans = _spans(trace["traceEvents"], rank)
        collectives = [e["name"] for lane, e in spans if lane == "collective"]
        assert collectives[:2] == ["all_reduce #1", "all_reduce #2"] and collectives[2].startswith("broadcast #")
        steps = [e for lane, e in spans if lane == "step" and e["args"]["collective"] == "all_reduce #1"]
        assert len(steps) == len(algorithms.get("all_reduce", "ring")(rank, 2, COUNT).steps)
        peer = 1 - rank
        lanes = {lane for lane, _ in spans}
        assert {f"send -> {peer}", f"recv <- {peer}", "reduce"} <= lanes
        for _lane, e in spans:
            assert e["dur"] >= 0 and e["ts"] > 0
        ring = [e for lane, e in spans if lane == "collective"][0]
        for e in steps:  # steps lie inside their collective (wall-clock microseconds: ~0.25 us resolution)
            assert ring["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= ring["ts"] + ring["dur"] + 1


def test_the_files_are_named_per_rank_and_group():
    assert timeline_path("out/run.json", 3) == "out/run.rank3.json"
    assert timeline_path("run", 0) == "run.rank0.json"
    assert timeline_path("run.json", 1, "group 2") == "run.group_2.rank1.json"


def test_traces_merge_into_one_file(tmp_path):
    paths = []
    for rank in range(2):
        trace = Trace(rank=rank)
        trace.span(rank, "step", "step 0", 1.0, 1.5, bytes=8)
        paths.append(str(tmp_path / f"t{rank}.json"))
        trace.write(paths[-1])
    merge(paths, str(tmp_path / "all.json"))
    merged = json.loads((tmp_path / "all.json").read_text())
    spans = [e for e in merged["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["pid"] for e in spans) == [0, 1]
    assert spans[0]["dur"] == 500000.0
    assert [s["rank"] for s in merged["otherData"]["sources"]] == [0, 1]
