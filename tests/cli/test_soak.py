"""The soak: its draws and references (pure), that it notices a wrong result, and a short run in CI."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from support.harness import free_port

from support.paths import SRC
import allreduce as dist
from allreduce.cli import soak
from allreduce.ops import ReduceOp



def test_every_rank_draws_the_same_calls():
    def sequence(seed):
        rng = np.random.default_rng(seed)
        return [soak.draw(rng, i, 4, 1000, 2) for i in range(200)]

    assert sequence(5) == sequence(5) != sequence(6)
    drawn = sequence(5)
    assert {c.kind for c in drawn} == set(soak.KINDS)
    assert all(0 <= c.count <= 1000 and 0 <= c.root < (2 if c.subgroup else 4) for c in drawn)


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.uint8, np.float32, np.complex64])
def test_inputs_reduce_exactly_in_any_order(dtype):
    for op in sorted(dist.ops.allowed_ops(dtype)):
        case = soak.Case(3, "all_reduce", 500, np.dtype(dtype), op, 0, None, False, False)
        inputs = [soak.make_input(case, r, 8, seed=1) for r in range(8)]
        forward, backward = soak.reduced(op, inputs), soak.reduced(op, inputs[::-1])
        assert np.array_equal(forward, backward), op
        if np.dtype(dtype).kind == "f":
            assert np.all(np.isfinite(forward)), op


def test_reference_matches_hand_computed_results():
    a, b = np.array([1, 2, 3], np.int32), np.array([4, -5, 6], np.int32)
    assert soak.reduced(ReduceOp.SUM, [a, b]).tolist() == [5, -3, 9]
    assert soak.reduced(ReduceOp.MAX, [a, b]).tolist() == [4, 2, 6]
    assert soak.reduced(ReduceOp.AVG, [a.astype(np.float32), b.astype(np.float32)]).tolist() == [2.5, -1.5, 4.5]


def test_a_wrong_result_is_counted(monkeypatch):
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=10)
    try:
        real = dist.all_reduce

        def off_by_one(tensor, *args, **kwargs):
            work = real(tensor, *args, **kwargs)
            if tensor.size and tensor.dtype.kind in "iuf":
                tensor.flat[0] += 1
            return work

        monkeypatch.setattr(dist, "all_reduce", off_by_one)
        tally = soak.soak(soak.SoakOptions(ops=150, seed=4, max_count=64))
    finally:
        dist.destroy_process_group()
    assert tally.wrong["all_reduce"] > 0 and not tally.error
    assert sum(tally.wrong.values()) == tally.wrong["all_reduce"]


def test_soak_outside_a_job_says_to_give_n(capsys):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "allreduce", "soak", "--ops", "1"], env=dict(env, PYTHONPATH=str(SRC)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "-n N" in proc.stderr, proc.stderr


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_short_soak_passes(transport):
    proc = subprocess.run([sys.executable, "-m", "allreduce", "soak", "-n", "4", "--ops", "250", "--seed", "11",
                           "--transport", transport, "--timeout", "30"],
                          env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 wrong, 0 hangs, 0 errors" in proc.stdout and proc.stdout.rstrip().endswith("PASS"), proc.stdout
