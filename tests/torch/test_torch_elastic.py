"""Elastic torchrun (``--nnodes 1:2 --max-restarts 3 --rdzv-backend c10d``) with the "allreduce" backend and
with our own API: a worker SIGKILLed mid-training.

- backend "allreduce" (``examples/elastic_torchrun.py``): torchrun restarts the workers, they resume
  from the last checkpoint and end with the parameters of an uninterrupted run (computed here, in one
  process, from the same model, data and optimizer);
- our API (``examples/elastic_survivors.py``): two agents (two nodes on one machine); the node without
  rank 0 is killed whole, and the ranks of the other node re-form a group of two and finish.

Each starts several torch processes on a loaded machine (a minute or more): marked slow (``pytest -m slow``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")

import torch
from support.harness import free_port
from support.paths import EXAMPLES

pytestmark = pytest.mark.slow
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
STEPS, FAIL_AT, RANKS = 12, 5, 2


def rdzv_flags(port: int, nnodes: str) -> list[str]:
    """torchrun's elastic flags; a short last call, so that a job of fewer than the maximum nodes starts at once."""
    return ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-conf", "last_call_timeout=1", "--monitor-interval", "0.2"]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def uninterrupted(example) -> dict[str, list]:
    """The run with no failure: each step's gradient is the mean over ranks of each rank's gradient, as DDP's."""
    model = example.make_model()
    optimizer = example.make_optimizer(model)
    for step in range(STEPS):
        optimizer.zero_grad()
        losses = [torch.nn.functional.mse_loss(model(x), y) for x, y in (example.batch(step, r) for r in range(RANKS))]
        (sum(losses) / RANKS).backward()
        optimizer.step()
    return {name: p.detach().tolist() for name, p in model.named_parameters()}


def test_a_killed_worker_restarts_from_the_checkpoint_and_ends_as_an_uninterrupted_run(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", *rdzv_flags(free_port(), "1:2"), "--max-restarts", "3",
               "--nproc-per-node", str(RANKS), str(EXAMPLES / "elastic_torchrun.py"), "--checkpoint",
               str(tmp_path / "ckpt.pt"), "--steps", str(STEPS), "--fail-at", str(FAIL_AT), "--out",
               str(tmp_path / "final.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "exitcode: -9" in done.stderr  # the worker was SIGKILLed, and torchrun restarted the job
    starts = re.findall(r"rank (\d)/2: attempt (\d) starts at step (\d+)", done.stdout)
    assert ("0", "0", "0") in starts and any(a != "0" and 0 < int(s) <= FAIL_AT for _, a, s in starts), starts
    got = json.loads((tmp_path / "final.json").read_text())
    want = uninterrupted(load_example("elastic_torchrun"))
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(torch.tensor(got[name]), torch.tensor(want[name]), rtol=0, atol=1e-5), name


def test_our_api_survivors_of_a_lost_node_reform_a_smaller_group_and_finish(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", *rdzv_flags(free_port(), "2"), "--max-restarts", "0",
               "--nproc-per-node", "2", str(EXAMPLES / "elastic_survivors.py"), "--steps", "100", "--pause", "0.1"]
    nodes = []
    try:
        for _ in range(2):  # the first agent hosts the rendezvous; the second joins it
            nodes.append(Node(command, tmp_path))
            time.sleep(2)
        for node in nodes:
            node.workers = {int(m.group(1)): int(m.group(2)) for m in node.collect(r"^rank (\d)/4 pid (\d+)", 2, 240)}
        lost, kept = (nodes[0], nodes[1]) if 0 in nodes[1].workers else (nodes[1], nodes[0])  # lost: not rank 0's
        time.sleep(2.0)  # some steps in the group of four
        lost.kill()
        # the workers' last lines; their agent then waits at torchrun's exit barrier for the lost node's
        results = [json.loads(m.group(0)) for m in kept.collect(r"^\{.*\}$", 2, 240)]
    finally:
        for node in nodes:
            node.kill()
    results.sort(key=lambda r: r["rank"])
    assert [(r["rank"], r["steps"]) for r in results] == [(0, 100), (1, 100)], results
    for r in results:
        assert r["job_rank"] < 2 and [size for size, _ in r["runs"]] == [4, 2], r  # four ranks, then two
        assert r["runs"][0][1] > 0 and r["runs"][1][1] > 0, r


class Node:
    """One torchrun agent and its workers (a session of their own), its output read by a thread."""

    def __init__(self, command: list[str], cwd):
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                     env=ENV, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.workers: dict[int, int] = {}  # job rank -> pid
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def collect(self, pattern: str, count: int, seconds: float) -> list[re.Match]:
        """The next ``count`` lines of output that match ``pattern``, read within ``seconds``."""
        deadline, found = time.monotonic() + seconds, []
        while len(found) < count and time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            match = re.search(pattern, line.rstrip("\n"))
            if match:
                found.append(match)
        if len(found) < count:
            raise AssertionError(f"{len(found)} of {count} lines matching {pattern!r} within {seconds}s:\n"
                                 f"{''.join(self.seen)[-4000:]}")
        return found

    def kill(self) -> None:
        """SIGKILL the agent and its workers (each worker runs in a session of its own)."""
        if self.proc.poll() is not None:  # the agent ended, and its workers before it
            return
        for pid in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
