"""The rest of Horovod's ``horovod.torch`` surface: ``SyncBatchNorm``, the timeline, ``mpi_ops``,
``broadcast_optimizer_state`` on a new optimizer, the warning of ``step()`` after ``synchronize()``,
and ``hvd.init()`` in a process started without a launcher.

References are computed here: SyncBatchNorm against torch's BatchNorm over the ranks' batches put
together, in float64 so that the only difference is the order of sums.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.hvd_harness import run_hvd

import allreduce.torch as hvd

SIZE = 3
ROWS = [3, 1, 4]  # the ranks' batch sizes differ


def batch_of(rank: int) -> torch.Tensor:
    return torch.randn(ROWS[rank], 4, 5, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)


def test_sync_batch_norm_normalizes_over_every_ranks_batch():
    def fn(rank, size):
        norm = hvd.SyncBatchNorm(4, momentum=0.5).double()
        with torch.no_grad():
            norm.weight.copy_(torch.arange(1.0, 5.0)), norm.bias.copy_(torch.arange(4.0))
        x = batch_of(rank).requires_grad_()
        out = norm(x)
        (out * torch.arange(5.0, dtype=torch.float64)).sum().backward()
        norm.eval()
        return out.detach(), x.grad, norm.running_mean, norm.running_var, norm(batch_of(rank)).detach()

    reference = torch.nn.BatchNorm1d(4, momentum=0.5).double()
    with torch.no_grad():
        reference.weight.copy_(torch.arange(1.0, 5.0)), reference.bias.copy_(torch.arange(4.0))
    whole = torch.cat([batch_of(r) for r in range(SIZE)]).requires_grad_()
    expected = reference(whole)
    (expected * torch.arange(5.0, dtype=torch.float64)).sum().backward()
    reference.eval()
    for rank, (out, grad, mean, var, evaluated) in enumerate(run_hvd(fn, SIZE)):
        mine = slice(sum(ROWS[:rank]), sum(ROWS[:rank + 1]))
        assert torch.allclose(out, expected[mine].detach(), atol=1e-12)
        assert torch.allclose(grad, whole.grad[mine], atol=1e-12)  # the gradient of every rank's loss
        assert torch.allclose(mean, reference.running_mean) and torch.allclose(var, reference.running_var)
        assert torch.allclose(evaluated, reference(batch_of(rank)).detach(), atol=1e-12)


def test_the_timeline_is_a_chrome_trace_of_negotiation_and_run(tmp_path):
    path = tmp_path / "timeline.json"

    def fn(rank, size):
        hvd.start_timeline(str(path), mark_cycles=True)
        hvd.allreduce(torch.ones(3), name="grads")
        hvd.synchronize(hvd.broadcast_async(torch.ones(2), root_rank=0))
        hvd.stop_timeline()
        return None

    run_hvd(fn, 2)
    events = json.loads(path.read_text())
    assert "start_time_since_epoch_in_micros" in events[0]["args"]
    names = {e["args"]["name"]: e["pid"] for e in events if e.get("name") == "process_name" and e["pid"]}
    assert set(names) == {"allreduce.grads", "broadcast.noname.1"}
    grads = [e for e in events if e.get("pid") == names["allreduce.grads"] and e["ph"] in "BE"]
    assert [(e["ph"], e.get("name")) for e in grads] == [("B", "NEGOTIATE_ALLREDUCE"), ("E", None),
                                                         ("B", "ALLREDUCE"), ("E", None)]
    assert all(a["ts"] <= b["ts"] for a, b in zip(grads, grads[1:]))
    assert any(e.get("name") == "CYCLE_START" for e in events)


def test_a_new_optimizers_state_is_created_and_step_after_synchronize_warns():
    def fn(rank, size):
        model = torch.nn.Linear(3, 2)
        frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        inner = torch.optim.SGD([*model.parameters(), frozen], lr=0.1, momentum=0.9)
        opt = hvd.DistributedOptimizer(inner, named_parameters=[*model.named_parameters(), ("frozen", frozen)])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        state = [sorted(opt.state[p]) for p in model.parameters()]
        model(torch.ones(1, 3) * (rank + 1)).sum().backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        with warnings.catch_warnings(record=True) as quiet:
            warnings.simplefilter("always")
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
        opt.close()
        return grads, frozen.grad, state, [str(w.message) for w in caught], len(quiet)

    for grads, frozen_grad, state, caught, quiet in run_hvd(fn, 2):
        assert all(g is not None and not g.any() for g in grads) and frozen_grad is None
        assert state == [["momentum_buffer"], ["momentum_buffer"]]
        assert len(caught) == 1 and "skip_synchronize()" in caught[0] and quiet == 0


def test_mpi_ops_holds_the_api_and_init_alone_is_one_rank():
    import allreduce.torch.mpi_ops as mpi_ops

    assert mpi_ops.synchronize is hvd.synchronize and set(mpi_ops.__all__) <= set(hvd.__all__)
    script = ("import torch, allreduce.torch as hvd; hvd.init(); "
              "print(hvd.rank(), hvd.size(), hvd.allreduce(torch.tensor([2.0])).item(), hvd.join())")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "1", "2.0", "0"], done.stderr
