"""DynamicLossScaler: skip and back off on overflow, unscale otherwise, grow after clean steps."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.torch_harness import batches, max_difference, model, run_ranks, shard, weights

import allreduce.torch as art


def test_overflow_skips_the_step_and_backs_off():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = art.DynamicLossScaler(init_scale=8.0, growth_interval=2)
    scaler.scale(p.sum() * float("inf")).backward()
    assert scaler.step(opt) is False
    assert scaler.scale_value == 4.0 and torch.equal(p.detach(), torch.ones(3))


def test_clean_steps_unscale_and_grow_the_scale():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = art.DynamicLossScaler(init_scale=8.0, growth_interval=2)
    for _step in range(2):
        opt.zero_grad()
        scaler.scale((p * 2).sum()).backward()
        assert scaler.step(opt) is True
        assert torch.equal(p.grad, torch.full((3,), 2.0))  # the true gradient, unscaled
    assert scaler.scale_value == 16.0
    assert torch.equal(p.detach(), torch.full((3,), -3.0))
    restored = art.DynamicLossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.scale_value == 16.0


@pytest.mark.parametrize("options", [dict(init_scale=0), dict(growth_factor=1.0), dict(backoff_factor=1.0),
                                     dict(growth_interval=0)])
def test_bad_options(options):
    with pytest.raises(ValueError):
        art.DynamicLossScaler(**options)


def test_fp16_training_backs_off_until_the_wire_holds_the_scaled_gradients():
    data = batches(20, 32)

    def fn(rank, size):
        m = model()
        opt = art.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression=art.Compression.fp16)
        scaler = art.DynamicLossScaler(init_scale=2.0**24, growth_interval=1000)
        stepped = []
        for batch in data:
            x, y = shard(batch, rank, size)
            opt.zero_grad()
            scaler.scale(torch.nn.CrossEntropyLoss()(m(x), y)).backward()
            stepped.append(scaler.step(opt))
        return stepped, scaler.scale_value, weights(m)

    results = run_ranks(fn, 2)
    stepped, scale, w = results[0]
    assert not stepped[0] and stepped[-1]  # 2**24 overflows fp16 on the wire; the scale comes down
    assert scale < 2.0**24
    for other in results[1:]:
        assert other[0] == stepped and other[1] == scale and max_difference(other[2], w) == 0.0


def test_zero_ranks_agree_to_skip_when_one_rank_overflows():
    def fn(rank, size):
        m = model()
        opt = art.ZeroRedundancyOptimizer(m.parameters(), torch.optim.SGD, lr=0.1)
        scaler = art.DynamicLossScaler(init_scale=4.0)
        x, y = shard(batches(1, 32)[0], rank, size)
        loss = torch.nn.CrossEntropyLoss()(m(x), y) * (float("inf") if rank == 1 else 1.0)
        scaler.scale(loss).backward()
        before = weights(m)
        stepped = scaler.step(opt)  # rank 0's gradients are finite: it must skip all the same
        return stepped, scaler.scale_value, max_difference(before, weights(m))

    assert run_ranks(fn, 2) == [(False, 2.0, 0.0), (False, 2.0, 0.0)]
