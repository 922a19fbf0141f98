"""``hvd.DistributedOptimizer``: a real ``torch.optim.Optimizer``, and Horovod's keywords with Horovod's meaning.

The reference is plain ``torch.optim.SGD`` in this process on the whole batch (the ranks each take an
equal share; the average of their mean losses is the mean over the batch). Tolerance 1e-5: float32
summation order only, as in test_torch_optimizer.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.hvd_harness import run_hvd
from support.torch_harness import batches, max_difference, model, shard, weights

import allreduce.torch as hvd

DATA = batches(12, 24)


def sgd(m: torch.nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)


def reference(lr: float = 0.1, scheduled: bool = False) -> dict:
    m = model()
    opt = sgd(m, lr)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for x, y in DATA:
        opt.zero_grad()
        torch.nn.CrossEntropyLoss()(m(x), y).backward()
        opt.step()
        if scheduled:
            schedule.step()
    return weights(m)


def test_a_torch_optimizer_for_schedulers_grad_scaler_and_checkpoints():
    def fn(rank, size):
        m = model()
        base = sgd(m)
        opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters())
        stepped = []
        opt.register_step_pre_hook(lambda *_: stepped.append(True))
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for batch in DATA:  # Horovod's mixed-precision pattern
            x, y = shard(batch, rank, size)
            opt.zero_grad()
            scaler.scale(torch.nn.CrossEntropyLoss()(m(x), y)).backward()
            opt.synchronize()
            scaler.unscale_(opt)
            with opt.skip_synchronize():
                scaler.step(opt)
            scaler.update()
            schedule.step()
        facts = [isinstance(opt, torch.optim.Optimizer), opt.param_groups is base.param_groups, opt.state is base.state,
                 opt.defaults is base.defaults, len(stepped), opt.param_groups[0]["lr"]]
        trained = weights(m)
        fresh = hvd.DistributedOptimizer(sgd(model(seed=1)))
        fresh.load_state_dict(opt.state_dict())
        loaded = fresh.state_dict()["state"][0]["momentum_buffer"]
        facts.append(torch.equal(loaded, base.state[m[0].weight]["momentum_buffer"]))
        extra = torch.nn.Linear(3, 1)
        opt.add_param_group({"params": extra.parameters(), "lr": 0.5, "momentum": 0.0})
        bias = extra.bias.detach().clone()
        opt.zero_grad()
        extra(torch.full((1, 3), rank + 1.0)).sum().backward()
        opt.step()
        facts += [opt.num_buckets, extra.weight.grad.tolist(), (extra.bias.detach() - bias).item()]
        opt.close()
        fresh.close()
        return trained, facts

    results = run_hvd(fn, 2)
    for trained, facts in results:
        assert max_difference(trained, reference(scheduled=True)) <= 1e-5
        assert facts[:-1] == [True, True, True, True, 12, 0.1 * 0.5**4, True, 1, [[1.5, 1.5, 1.5]]]
        assert facts[-1] == pytest.approx(-0.5)  # the new group's bias: lr 0.5 x an average gradient of 1


def test_horovod_keywords_mean_what_they_mean_in_horovod():
    def fn(rank, size):
        out = {}
        pair = hvd.add_process_set([0, 2])  # rank 1 is outside: it steps on its own, on the whole batch
        m = model()
        # Horovod's positional order, through process_set; gradients predivided by 4 (and multiplied back)
        opt = hvd.DistributedOptimizer(sgd(m), m.named_parameters(), hvd.Compression.none, 1, hvd.Average, 4.0, 0,
                                       [[m[0].weight, m[4].bias]], False, pair)
        index, count = (pair.rank(), 2) if pair.included() else (0, 1)
        for batch in DATA:
            x, y = shard(batch, index, count)
            opt.zero_grad()
            torch.nn.CrossEntropyLoss()(m(x), y).backward()
            opt.step()
        out["process set"], out["buckets"] = weights(m), opt.num_buckets
        opt.close()

        m = model()
        opt = hvd.DistributedOptimizer(sgd(m), m.named_parameters(), hvd.Compression.none, 2, hvd.Sum)
        for batch in DATA:
            x, y = shard(batch, rank, size)
            opt.zero_grad()
            for half in (slice(0, 4), slice(4, 8)):
                (torch.nn.CrossEntropyLoss()(m(x[half]), y[half]) / 2).backward()
            opt.step()
        out["sum of 2 passes"] = weights(m)
        opt.close()

        with pytest.warns(DeprecationWarning, match="num_groups"):
            opt = hvd.DistributedOptimizer(sgd(model()), num_groups=4)
        out["num_groups"] = opt.num_buckets
        opt.close()
        with pytest.raises(ValueError, match="gradient_predivide_factor"):
            hvd.DistributedOptimizer(sgd(model()), op=hvd.Sum, gradient_predivide_factor=2.0)

        table = torch.nn.Embedding(10, 4, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(table.parameters(), lr=0.1), sparse_as_dense=True)
        before = table.weight.detach().clone()
        table(torch.tensor([rank, rank, 5])).sum().backward()
        opt.step()
        out["sparse"] = [table.weight.grad.is_sparse, (table.weight.detach() - before)[:, 0].tolist()]
        opt.close()
        return out

    results = run_hvd(fn, 3)
    for out in results:
        assert max_difference(out["process set"], reference()) <= 1e-5
        assert out["buckets"] == 5  # the group of two, and one group per other parameter
        assert max_difference(out["sum of 2 passes"], reference(lr=0.3)) <= 1e-5  # Sum over 3 ranks: 3x the mean
        assert out["num_groups"] == 4
        assert out["sparse"][0]
        assert out["sparse"][1] == pytest.approx([-0.2 / 3] * 3 + [0.0, 0.0, -0.1] + [0.0] * 4, abs=1e-7)
