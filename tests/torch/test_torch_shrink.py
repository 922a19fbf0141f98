"""``torch.distributed.shrink_group`` on the "allreduce" backend: DDP under ``torchrun --nproc-per-node 4``, a rank
SIGKILLed at step 10; the survivors shrink, rebuild DDP and finish 30 steps in the same processes, with the
parameters of a 3-rank run resumed from the step-10 state (replayed here, in one process).

torchrun's agent stops the whole job at the first poll that sees a dead worker; a long monitor interval lets
the survivors finish first (the agent then reports the death and exits non-zero). Marked slow: four torch
processes and a 30 s poll on a loaded machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

import torch

from support.paths import ROOT

pytestmark = pytest.mark.slow
WORKER = ROOT / "tests" / "torch" / "shrink_worker.py"
STEPS, KILL_AT, RANKS = 30, 10, 4


def _worker():
    spec = importlib.util.spec_from_file_location("shrink_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replayed(victim: int) -> dict[str, torch.Tensor]:
    """KILL_AT steps of 4 ranks, then 3 without ``victim``: each gradient the mean of the ranks' (as DDP's)."""
    worker = _worker()
    model = worker.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        ranks = range(RANKS) if step < KILL_AT else [r for r in range(RANKS) if r != victim]
        grads = []
        for r in ranks:
            optimizer.zero_grad()
            x, y = worker.batch(step, r)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(g / len(ranks) for g in gs)
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize("victim", [1, 0])
def test_ddp_survivors_shrink_and_end_as_a_three_rank_run_resumed(tmp_path, victim):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS),
               "--max-restarts", "0", "--monitor-interval", "30", str(WORKER), "--steps", str(STEPS),
               "--kill-at", str(KILL_AT), "--victim", str(victim), "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    survivors = [r for r in range(RANKS) if r != victim]
    outputs = {r: tmp_path / f"rank{r}.json" for r in survivors}
    assert all(path.exists() for path in outputs.values()), done.stdout[-3000:] + done.stderr[-6000:]
    assert "exitcode: -9" in done.stderr or "Signal 9" in done.stderr, done.stderr[-3000:]
    want = replayed(victim)
    for r, path in outputs.items():
        got = json.loads(path.read_text())
        assert (got["size"], got["shrunk_at"]) == (RANKS - 1, KILL_AT), got
        for name, value in want.items():
            assert torch.allclose(torch.tensor(got["params"][name]), value, rtol=0, atol=1e-6), (r, name)
