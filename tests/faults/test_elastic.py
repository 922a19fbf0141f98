"""Horovod's elastic mode under ``allreduce run -n 4 --min-np 2``: a worker SIGKILLs itself mid-epoch; the
survivors restore the last commit, shrink, sync from the new rank 0 and finish in the same processes, with
the parameters that a run from that commit on the survivors computes (replayed here in one process).
With ``--max-np 4`` the launcher starts a replacement, which the others let in at a commit and which ends
with their parameters."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from support.paths import SRC

torch = pytest.importorskip("torch")

EPOCHS, BATCHES, KILL_AT = 2, 6, (0, 3)  # the victim dies in epoch 0, before batch 3's gradients
REGROWN_AT = (1, 0)  # with --max-np: the others wait there, committing, until the replacement is in

COMMON = textwrap.dedent("""
    import torch

    def batch(step, rank):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(5 + rank, 3, generator=g, dtype=torch.float64)   # uneven batches: averaging is per worker
        return x, x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3

    def fresh():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1).double()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def loss_of(model, step, rank):
        x, y = batch(step, rank)
        return torch.nn.functional.mse_loss(model(x).squeeze(1), y)
""")

SCRIPT = COMMON + textwrap.dedent(f"""
    import os, signal, sys, time
    import allreduce.torch as hvd

    hvd.init()
    me = hvd.rank()
    model, opt = fresh()
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    resets = []

    @hvd.elastic.run
    def train(state):
        print(f"start size {{hvd.size()}} at {{state.epoch}} {{state.batch}}", flush=True)
        for state.epoch in range(state.epoch, {EPOCHS}):
            for state.batch in range(state.batch, {BATCHES}):
                if me == int(sys.argv[1]) and (state.epoch, state.batch) == {KILL_AT}:
                    os.kill(os.getpid(), signal.SIGKILL)
                while "grow" in sys.argv and (state.epoch, state.batch) == {REGROWN_AT} and hvd.size() < 4:
                    time.sleep(0.2)
                    state.commit()  # raises HostsUpdatedInterrupt on every rank once the replacement waits
                opt.zero_grad()
                loss_of(model, state.epoch * {BATCHES} + state.batch, hvd.rank()).backward()
                opt.step()
                state.batch += 1
                state.commit()
            state.batch = 0
        return hvd.size()

    state = hvd.elastic.TorchState(model, opt, epoch=0, batch=0)
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    size = train(state)
    params = [float(v) for p in model.parameters() for v in p.detach().flatten()]
    print(f"done size {{size}} resets {{resets}} params {{params!r}}", flush=True)
""")


def _replay(*sizes_from: tuple[int, int]) -> list[float]:
    """The parameters of 4 workers training from step 0, then each (size, step) of ``sizes_from``: that
    many workers from that step on."""
    scope: dict = {}
    exec(COMMON, scope)
    model, opt = scope["fresh"]()
    for step in range(EPOCHS * BATCHES):
        n = [size for size, start in [(4, 0), *sizes_from] if start <= step][-1]
        opt.zero_grad()
        (sum(scope["loss_of"](model, step, r) for r in range(n)) / n).backward()
        opt.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def _run(tmp_path, *flags: str, script_args: tuple[str, ...] = ("2",)):
    script = tmp_path / "elastic.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("ALLREDUCE_")}
    done = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "4", "--min-np", "2", *flags, "--",
                           sys.executable, str(script), *script_args],
                          env={**env, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=180)
    return done, done.stdout + done.stderr


@pytest.mark.parametrize("victim", [2, pytest.param(0, marks=pytest.mark.slow)])  # 0: the store's host
def test_survivors_restore_the_commit_and_finish_in_the_same_processes(tmp_path, victim):
    done, out = _run(tmp_path, script_args=(str(victim),))
    assert done.returncode == 0, out
    assert f"rank {victim} was killed by SIGKILL" in done.stderr, out
    restarts = re.findall(rf"^\[{1 if victim == 0 else 0}\] start size 3 at (\d+) (\d+)$", done.stdout, re.M)
    assert len(restarts) == 1, out
    epoch, batch = map(int, restarts[0])
    resumed = epoch * BATCHES + batch
    assert resumed == KILL_AT[0] * BATCHES + KILL_AT[1], out  # nobody can have finished the victim's step
    finals = dict(re.findall(r"^\[(\d)\] done size 3 resets \[3\] params (\[.*\])$", done.stdout, re.M))
    assert sorted(finals) == [r for r in "0123" if r != str(victim)], out
    expected = _replay((3, resumed))
    for rank, text in finals.items():
        assert eval(text) == pytest.approx(expected, abs=1e-6), (rank, out)
    assert _replay() != pytest.approx(expected, abs=1e-6)  # the replay tells the runs apart


@pytest.mark.slow  # about 30 s on a busy 2-core machine; test_grow.py checks the launcher's replacements
def test_a_replacement_joins_at_a_commit_and_ends_with_the_same_parameters(tmp_path):
    done, out = _run(tmp_path, "--max-np", "4", script_args=("2", "grow"))
    assert done.returncode == 0, out
    assert "started a replacement worker [4]" in done.stderr, out
    starts = re.findall(r"^\[0\] start size (\d) at (\d+) (\d+)$", done.stdout, re.M)
    sizes_from = [(int(size), int(epoch) * BATCHES + int(batch)) for size, epoch, batch in starts[1:]]
    regrown = REGROWN_AT[0] * BATCHES + REGROWN_AT[1]
    assert sizes_from[-1] == (4, regrown) and set(sizes_from[:-1]) <= {(3, KILL_AT[1])}, out
    assert re.search(rf"^\[4\] start size 4 at {REGROWN_AT[0]} {REGROWN_AT[1]}$", done.stdout, re.M), out
    finals = dict(re.findall(r"^\[(\d)\] done size 4 resets \[[34, ]*\] params (\[.*\])$", done.stdout, re.M))
    assert sorted(finals) == ["0", "1", "3", "4"], out
    expected = _replay(*sizes_from)
    for rank, text in finals.items():
        assert eval(text) == pytest.approx(expected, abs=1e-6), (rank, out)
    assert _replay((3, KILL_AT[1])) != pytest.approx(expected, abs=1e-6)


def test_an_error_that_cost_no_rank_is_raised_after_the_restore():
    from support.harness import run_ranks

    def body(rank, size):
        import allreduce.torch as hvd
        hvd.init()
        calls = []

        @hvd.elastic.run
        def train(state):
            calls.append(state.value)
            state.value = 99  # not committed: the restore takes it back
            hvd.allreduce(torch.ones(rank + 1), name="shapes differ")  # a Mismatch on every rank
        state = hvd.elastic.ObjectState(value=rank)
        try:
            train(state)
        except hvd.HorovodInternalError as exc:
            return type(exc).__name__, calls, state.value, hvd.size()
    assert run_ranks(body, 2, deadline=60) == [("Mismatch", [0], 0, 2)] * 2
