"""ZeroRedundancyOptimizer: the unsharded trajectory, with 1/n of the optimizer state per rank.

The model has 484 parameters; with four ranks each shard has 121, so every Adam moment tensor a
rank holds has 121 elements: 242 state elements per rank where the unsharded optimizer holds 968.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.torch_harness import batches, max_difference, model, run_ranks, shard, weights

import allreduce.torch as art

STEPS, BATCH, SIZE = 50, 64, 4
DATA = batches(STEPS, BATCH)
CHECKPOINTS = (10, 25, 50)


def trajectory(m, opt, rank=0, size=1, stage=None):
    """Train on ``DATA``; return the weights at each checkpoint and the gradient elements held at the end."""
    loss_fn = torch.nn.CrossEntropyLoss()
    seen = {}
    for step, batch in enumerate(DATA, 1):
        x, y = shard(batch, rank, size)
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()
        if step in CHECKPOINTS:
            seen[step] = weights(m)
    held = sum(p.grad.numel() for p in m.parameters() if p.grad is not None)
    if stage is not None:
        held += sum(p.grad.numel() for g in opt.param_groups for p in g["params"] if p.grad is not None)
    return seen, held


def unsharded():
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    seen, _ = trajectory(m, opt)
    state = [t.numel() for s in opt.state.values() for t in s.values() if t.dim() > 0]
    return seen, state


@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_adam_follows_the_unsharded_trajectory_with_a_quarter_of_the_state(stage):
    def fn(rank, size):
        m = model()
        opt = art.ZeroRedundancyOptimizer(m.parameters(), torch.optim.Adam, stage=stage, lr=0.01)
        seen, held = trajectory(m, opt, rank, size, stage)
        state = [t.numel() for s in opt.optimizer.state.values() for t in s.values() if t.dim() > 0]
        return seen, state, held

    expected, full_state = unsharded()
    total = sum(p.numel() for p in model().parameters())
    assert sum(full_state) == 2 * total  # exp_avg and exp_avg_sq of every parameter
    results = run_ranks(fn, SIZE)
    for seen, state, held in results:
        for step in CHECKPOINTS:
            assert max_difference(seen[step], expected[step]) <= 1e-5, step
        assert state == [total // SIZE] * 2  # exp_avg and exp_avg_sq of this rank's shard only
        assert sum(state) * SIZE == sum(full_state)
        # stage 1 keeps the full averaged gradients (plus the shard's copy); stage 2 only the shard's
        assert held == (total + total // SIZE if stage == 1 else total // SIZE)
    for seen, _, _ in results[1:]:
        assert max_difference(seen[STEPS], results[0][0][STEPS]) == 0.0


def test_parameter_groups_keep_their_options_and_bad_arguments_are_refused():
    def fn(rank, size):
        m = model()
        groups = [{"params": m[0].parameters(), "lr": 0.0},
                  {"params": list(m[2].parameters()) + list(m[4].parameters())}]
        opt = art.ZeroRedundancyOptimizer(groups, torch.optim.SGD, lr=0.1)
        frozen = m[0].weight.detach().clone()
        x, y = shard(DATA[0], rank, size)
        torch.nn.CrossEntropyLoss()(m(x), y).backward()
        opt.step()
        assert torch.equal(m[0].weight, frozen) and [g["lr"] for g in opt.param_groups] == [0.0, 0.1]
        with pytest.raises(ValueError, match="stage"):
            art.ZeroRedundancyOptimizer(m.parameters(), torch.optim.SGD, stage=3, lr=0.1)
        mixed = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]
        with pytest.raises(ValueError, match="one dtype"):
            art.ZeroRedundancyOptimizer(mixed, torch.optim.SGD, lr=0.1)
        return weights(m)

    first, second = run_ranks(fn, 2)
    assert max_difference(first, second) == 0.0
