"""A rank SIGKILLed in an all-reduce loop: the survivors agree, shrink and finish every step in the same processes.

Each rank adds ``(id + 1) * (step + 1)`` (``id``: its rank when the job began), so every step's sum says
exactly which ranks took part; the survivors resume at the lowest step any of them had not finished.
The victim is rank 0 (the store's host, so the shrunk group needs a new store) or one in the middle;
in one case a second rank dies while the others agree.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import numpy as np
import pytest
from support.harness import run_ranks

import allreduce as dist

STEPS = 40
KILL_AT = 10
COUNT = 1 << 16


def _die(stamp: str, delay: float) -> None:
    def kill():
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Timer(delay, kill).start()


def _loop(victims: tuple[int, ...], stamp: str, count: int = COUNT):
    """Run STEPS all-reduces; ``victims[0]`` dies in step KILL_AT, ``victims[1:]`` (if any) once they see it."""
    def body(rank, size):
        ids, step, checked, broke = list(range(size)), 0, [], None
        while step < STEPS:
            if rank == victims[0] and step == KILL_AT:
                _die(stamp, random.uniform(0, 0.01))
            if rank == victims[0] and step == KILL_AT + 3:
                time.sleep(5)  # dies by then, with its peers in step KILL_AT + 3 at the latest
            x = np.full(count, (rank + 1) * (step + 1), np.int64)
            try:
                dist.all_reduce(x)
            except dist.AllreduceError:
                if rank in victims[1:]:  # dies while the others agree
                    _die(stamp + ".2", random.uniform(0, 0.02))
                    time.sleep(5)
                broke = time.time() if broke is None else broke
                dist.shrink_group()
                survivors = [0] * dist.get_world_size()
                dist.all_gather_object(survivors, rank)
                ids = survivors
                step = int(dist.all_reduce_scalar(step, dist.ReduceOp.MIN))
                continue
            expected = sum(i + 1 for i in ids) * (step + 1)
            checked.append((step, tuple(ids), bool((x == expected).all())))
            if broke is not None:  # the first step done after a shrink
                checked.append((-1, time.time(), broke))
                broke = None
            step += 1
        return ids, checked
    return body


def _check(results, size, victims, stamp):
    survivors = [r for r in range(size) if r not in victims]
    for v in victims:
        assert results[v][0] == "killed", (v, results[v])
    finals = {tuple(results[r][0]) for r in survivors}
    assert finals == {tuple(survivors)}, finals
    recoveries = []
    with open(stamp) as f:
        died = float(f.read())
    for r in survivors:
        ids, checked = results[r]
        steps = [c for c in checked if c[0] >= 0]
        assert all(ok for _, _, ok in steps), [c for c in steps if not c[2]]
        assert sorted({s for s, _, _ in steps}) == list(range(STEPS)), r
        last = {s: s_ids for s, s_ids, _ in steps}  # who took part in each step, as last done
        shrunk = [s for s in range(STEPS) if last[s] == tuple(survivors)]
        assert shrunk == list(range(shrunk[0], STEPS)) and shrunk[0] >= KILL_AT, last
        recoveries += [t - died for s, t, _ in checked if s == -1]
    return recoveries


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("victim", [0, 2])
def test_survivors_shrink_and_finish_every_step(victim, transport, tmp_path):
    stamp = str(tmp_path / "died")
    results = run_ranks(_loop((victim,), stamp), 4, timeout=600, deadline=90, expect_errors=True,
                        env={"ALLREDUCE_TRANSPORT": transport})
    recoveries = _check(results, 4, (victim,), stamp)
    assert recoveries and max(recoveries) < 3.0, recoveries  # default timeouts: back within 3 s


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_second_death_during_the_agreement(transport, tmp_path):
    stamp = str(tmp_path / "died")
    results = run_ranks(_loop((1, 3), stamp), 4, timeout=600, deadline=90, expect_errors=True,
                        env={"ALLREDUCE_TRANSPORT": transport})
    _check(results, 4, (1, 3), stamp)
