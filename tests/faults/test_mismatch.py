"""Mismatched calls are errors on every rank, naming the rank that differs and how; never a hang or wrong data.

One job of three ranks runs every case on a fresh subgroup (a failure breaks only that subgroup): rank
1 calls with one argument changed, the others with the base arguments, then every rank calls a
barrier on the subgroup. Every rank must raise, in the mismatched call itself or, at the latest, in
that next call (a rank whose part of the collective was done already, e.g. a reduce leaf that only
sends, hears from the others when it next talks to them).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks

import allreduce as dist
from allreduce import collectives

pytestmark = engines.BOTH  # the lines run in Python and in C

SIZE = 3
ODD = 1  # the rank that calls differently
BASE = dict(count=6, dtype=np.float32, op=dist.ReduceOp.SUM, root=0)


def invoke(collective: str, group, rank: int, count: int, dtype, op, root: int) -> None:
    """Call ``collective`` on ``group`` with buffers of ``count`` elements per block."""
    x = np.ones(count, dtype)
    block = SIZE * count
    if collective == "all_reduce":
        dist.all_reduce(x, op, group=group)
    elif collective == "reduce":
        dist.reduce(x, root, op, group=group)
    elif collective == "broadcast":
        dist.broadcast(x, root, group=group)
    elif collective == "all_gather":
        dist.all_gather_into_tensor(np.empty(block, dtype), x, group=group)
    elif collective == "reduce_scatter":
        dist.reduce_scatter_tensor(x, np.ones(block, dtype), op, group=group)
    elif collective == "all_to_all":
        dist.all_to_all_single(np.empty(block, dtype), np.ones(block, dtype), group=group)
    elif collective == "gather":
        outs = [np.empty(count, dtype) for _ in range(SIZE)] if rank == root else None
        dist.gather(x, outs, root, group=group)
    elif collective == "scatter":
        ins = [np.ones(count, dtype) for _ in range(SIZE)] if rank == root else None
        dist.scatter(x, ins, root, group=group)
    else:
        dist.barrier(group=group)


ALL = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
REDUCING = [c for c in ALL if collectives.get(c).reduces]
ROOTED = [c for c in ALL if collectives.get(c).rooted]

# (name, the words every rank's error must contain, what each rank calls: rank -> [(collective, args)])
CASES = (
    [(f"{c}-count", "count", {"count": 7}, c) for c in ALL]
    + [(f"{c}-dtype", "dtype", {"dtype": np.int32}, c) for c in ALL]
    + [(f"{c}-op", "op", {"op": dist.ReduceOp.MAX}, c) for c in REDUCING]
    + [(f"{c}-root", "root", {"root": 1}, c) for c in ROOTED]
    + [(f"{c}-root-self", "root", "self", c) for c in ROOTED]
)
ORDERS = (  # rank ODD calls the second list, the others the first
    ("all_reduce/broadcast", ["all_reduce", "broadcast"], ["broadcast", "all_reduce"]),
    ("barrier/all_reduce", ["barrier"], ["all_reduce"]),
    ("all_gather/all_to_all", ["all_gather"], ["all_to_all"]),
    ("broadcast/scatter", ["broadcast"], ["scatter"]),
    ("reduce/gather", ["reduce"], ["gather"]),
)


def plan(rank: int):
    """Every case as (name, words, the calls this rank makes)."""
    out = []
    for name, words, change, collective in CASES:
        args = dict(BASE)
        if change == "self":
            args["root"] = rank
        elif rank == ODD:
            args.update(change)
        out.append((name, words, [(collective, args)]))
    for name, usual, odd in ORDERS:
        calls = odd if rank == ODD else usual
        out.append((name, "collective", [(c, BASE) for c in calls]))
    return out


def _every_case(rank, size):
    outcomes = {}
    for name, _words, calls in plan(rank):
        group = dist.new_group(list(range(size)), timeout=2.0)
        start = time.monotonic()
        where = "call"
        try:
            for collective, args in calls:
                invoke(collective, group, rank, **args)
            where = "next"
            dist.barrier(group=group)
            outcomes[name] = ("no error", "", time.monotonic() - start, where)
        except dist.AllreduceError as exc:
            outcomes[name] = (type(exc).__name__, str(exc), time.monotonic() - start, where)
        dist.destroy_process_group(group)
    return outcomes


@pytest.fixture(scope="module")
def outcomes():
    return run_ranks(_every_case, SIZE, timeout=30, deadline=240)


@pytest.mark.parametrize("name,words", [(c[0], c[1]) for c in plan(0)])
def test_mismatch_is_an_error_on_every_rank(outcomes, name, words):
    for rank in range(SIZE):
        kind, message, elapsed, where = outcomes[rank][name]
        assert kind in ("Mismatch", "PeerLost"), (rank, kind, message)
        assert words in message, (rank, message)
        differs = [r for r in range(SIZE) if r != rank and (r == ODD or rank == ODD or name.endswith("self"))]
        named = [f"rank {r}" for r in differs]
        assert any(n in message for n in named), (rank, message)
        assert elapsed < 5.0, (rank, elapsed, message)


def test_a_rank_raises_at_the_next_call_only_after_a_rooted_collective(outcomes, capsys):
    """Some rank catches every mismatch in the call itself, and a rank hears of it only at the next call
    just where its own part could finish without the rank that differs: a rooted collective's leaves
    that only send, or only receive. In the others every rank needs data that passes through rank ODD.
    The tally is printed."""
    cases = plan(0)
    rooted = {name for rank in (0, ODD) for name, _, calls in plan(rank)
              if any(collectives.get(c).rooted for c, _ in calls)}
    late = sorted((name, rank) for rank in range(SIZE) for name, o in outcomes[rank].items() if o[3] == "next")
    slowest = max(o[2] for r in outcomes for o in r.values())
    with capsys.disabled():
        print(f"\nmismatch: {len(cases)} cases x {SIZE} ranks: {len(cases) * SIZE - len(late)} errors in the call, "
              f"{len(late)} at the next call, slowest {slowest:.2f}s")
    assert [name for name, _, _ in cases if all(outcomes[r][name][3] == "next" for r in range(SIZE))] == []
    assert [(name, rank) for name, rank in late if name not in rooted] == []
