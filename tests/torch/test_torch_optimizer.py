"""DistributedOptimizer: four ranks train like one rank on the whole batch, and its controls behave.

The reference is plain ``torch.optim.SGD`` in this process on the 4x batch; the ranks each take a
quarter of every batch (the mean loss of a quarter, averaged over four ranks, is the mean over the
whole batch). Tolerances after 50 steps of SGD(lr=0.1, momentum=0.9), weights of magnitude ~1.6:

- no compression: 1e-5 (float32 summation order only; measured ~3e-7);
- fp16 on the wire: 1e-3 (two fp16 roundings per gradient per step, relative 2**-11 each; measured
  ~1.6e-4);
- bf16 on the wire: 5e-3 (8-bit mantissa; measured ~1.1e-3).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.torch_harness import batches, max_difference, model, run_ranks, shard, train, weights

import allreduce.torch as art
from allreduce import ReduceOp

STEPS, BATCH, SIZE = 50, 64, 4
DATA = batches(STEPS, BATCH)


def sgd(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def reference(data=DATA, clip: float | None = None) -> dict[str, np.ndarray]:
    m = model()
    opt = sgd(m)
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in data:
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
    return weights(m)


def distributed(compression, **options):
    def fn(rank, size):
        m = model()
        opt = art.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters(), compression=compression,
                                       **options)
        train(m, opt, DATA, rank, size)
        opt.close()
        return weights(m)

    return fn


@pytest.mark.parametrize("compression, tolerance", [
    (art.Compression.none, 1e-5),
    (art.Compression.fp16, 1e-3),
    (art.Compression.bf16, 5e-3),
])
def test_four_ranks_match_one_rank_on_the_whole_batch(compression, tolerance):
    results = run_ranks(distributed(compression, fusion_threshold_mb=0.001), SIZE)
    assert max_difference(results[0], reference()) <= tolerance
    for other in results[1:]:
        assert max_difference(results[0], other) == 0.0  # every rank decodes the same bits


def test_error_feedback_compression_trains_within_the_bf16_tolerance():
    results = run_ranks(distributed(art.Compression.error_feedback(art.Compression.bf16)), SIZE)
    assert max_difference(results[0], reference()) <= 5e-3
    assert all(max_difference(results[0], other) == 0.0 for other in results[1:])


def test_backward_passes_per_step_accumulates_locally():
    def fn(rank, size):
        m = model()
        opt = art.DistributedOptimizer(sgd(m), backward_passes_per_step=2)
        loss_fn = torch.nn.CrossEntropyLoss()
        for batch in DATA[:10]:
            x, y = shard(batch, rank, size)
            opt.zero_grad()
            for half in (slice(0, len(x) // 2), slice(len(x) // 2, None)):
                (loss_fn(m(x[half]), y[half]) / 2).backward()
            assert opt.in_flight == opt.num_buckets  # launched by the second pass, not the first
            opt.step()
        return weights(m)

    results = run_ranks(fn, SIZE)
    assert max_difference(results[0], reference(DATA[:10])) <= 1e-5


def test_zero_grad_refuses_in_flight_and_skip_synchronize_allows_clipping():
    def fn(rank, size):
        m = model()
        opt = art.DistributedOptimizer(sgd(m), fusion_threshold_mb=0)
        loss_fn = torch.nn.CrossEntropyLoss()
        refused = 0
        for batch in DATA[:10]:
            x, y = shard(batch, rank, size)
            loss_fn(m(x), y).backward()
            try:
                opt.zero_grad()
            except RuntimeError as exc:
                refused += "in flight" in str(exc)
            opt.synchronize()
            opt.synchronize()  # idempotent until the next backward
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            with opt.skip_synchronize():
                opt.step()
            opt.zero_grad()
        loss_fn(m(x), y).backward()
        with opt.skip_synchronize():
            with pytest.raises(RuntimeError, match="skip_synchronize"):
                opt.step()
        opt.synchronize()
        return refused, weights(m)

    results = run_ranks(fn, SIZE)
    assert [refused for refused, _ in results] == [10] * SIZE
    assert max_difference(results[0][1], reference(DATA[:10], clip=0.5)) <= 1e-5


def test_buckets_follow_the_fusion_threshold_and_start_during_backward():
    def fn(rank, size):
        m = model()
        one = art.DistributedOptimizer(sgd(m))
        counts = [one.num_buckets]
        one.close()
        opt = art.DistributedOptimizer(sgd(m), fusion_threshold_mb=0)
        counts.append(opt.num_buckets)
        seen = []
        first = m[0].weight  # its gradient is among the last that backward computes
        first.register_post_accumulate_grad_hook(lambda p: seen.append(opt.in_flight))
        x, y = shard(DATA[0], rank, size)
        torch.nn.CrossEntropyLoss()(m(x), y).backward()
        opt.step()
        return counts, seen

    for counts, seen in run_ranks(fn, 2):
        assert counts == [1, 6]  # one bucket for the whole model; one per tensor at threshold 0
        assert seen and seen[0] >= 4  # the later layers' buckets were already communicating


def test_unused_parameters_reduce_as_zero_and_ranks_stay_equal():
    def fn(rank, size):
        torch.manual_seed(0)
        used, unused = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
        params = list(used.parameters()) + list(unused.parameters())
        opt = art.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), fusion_threshold_mb=0)
        for step in range(5):
            x = torch.full((3, 4), float(rank + step))
            branch = unused if (rank + step) % 2 else used  # ranks disagree on which layer they use
            branch(x).sum().backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().numpy().copy() for p in params]

    first, second = run_ranks(fn, 2)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_broadcast_parameters_and_optimizer_state():
    def fn(rank, size):
        m = model(seed=rank)
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        if rank == 0:
            x, y = DATA[0]
            torch.nn.CrossEntropyLoss()(m(x), y).backward()
            opt.step()
        art.broadcast_parameters(m.state_dict(), root_rank=0)
        art.broadcast_optimizer_state(opt, root_rank=0)
        state = opt.state_dict()["state"]
        return weights(m), {k: v["exp_avg"].numpy().copy() for k, v in state.items()}

    results = run_ranks(fn, 3)
    for w, moments in results[1:]:
        assert max_difference(w, results[0][0]) == 0.0
        assert moments.keys() == results[0][1].keys() and len(moments) == 6
        for k in moments:
            np.testing.assert_array_equal(moments[k], results[0][1][k])


def test_errors():
    def fn(rank, size):
        m = model()
        with pytest.raises(ValueError, match="op"):
            art.DistributedOptimizer(sgd(m), op=ReduceOp.MAX)
        with pytest.raises(ValueError, match="backward_passes_per_step"):
            art.DistributedOptimizer(sgd(m), backward_passes_per_step=0)
        with pytest.raises(ValueError, match="named_parameters"):
            art.DistributedOptimizer(sgd(m), named_parameters=list(m.named_parameters())[:2])
        with pytest.raises(TypeError, match="Compressor"):
            art.DistributedOptimizer(sgd(m), compression="fp16")
        opt = art.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters())
        x, y = shard(DATA[0], rank, size)
        loss_fn = torch.nn.CrossEntropyLoss()
        loss_fn(m(x), y).backward()
        with pytest.raises(RuntimeError, match="computed 2 times"):
            loss_fn(m(x), y).backward()
        opt.close()
        return True

    assert run_ranks(fn, 2) == [True, True]


def test_a_group_is_required():
    m = model()
    with pytest.raises(RuntimeError, match="init_process_group"):
        art.DistributedOptimizer(sgd(m))


def _buckets_on_their_shortcut(rank, size):
    """Gradients (rank + 1) * (1 + position) of several buckets, averaged over 5 steps; how many bucket
    reductions of the gradient group took the general path (``ProcessGroup.collective``)."""
    from allreduce.runtime import ProcessGroup

    general = []
    issue = ProcessGroup.collective

    def counted(group, request, async_op=False):
        if ".grads" in group.name and request.collective == "all_reduce":
            general.append(request.op)
        return issue(group, request, async_op)

    ProcessGroup.collective = counted
    params = [torch.zeros(n, requires_grad=True) for n in (3, 1000, 7)]
    opts = {"op": ReduceOp.AVG}, {"op": ReduceOp.SUM}
    seen = []
    for options in opts:
        opt = art.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), fusion_threshold_mb=0.001, **options)
        for _ in range(5):
            opt.zero_grad()
            sum(((rank + 1.0) * (1 + torch.arange(p.numel())) * p).sum() for p in params).backward()
            opt.synchronize()
            seen.append([p.grad.tolist() for p in params])
        seen.append(opt.num_buckets)
        opt.close()
    ProcessGroup.collective = issue
    return seen, general


@pytest.mark.parametrize("size", [2, 3])
def test_bucket_reductions_of_a_known_shape_take_the_groups_shortcut(size):
    for seen, general in run_ranks(_buckets_on_their_shortcut, size):
        ranks = sum(r + 1.0 for r in range(size))
        for mean, steps in ((ranks / size, seen[:6]), (ranks, seen[6:])):
            *grads, buckets = steps
            want = [(mean * (1 + np.arange(p))).astype(np.float32).tolist() for p in (3, 1000, 7)]
            assert grads == [want] * 5
            assert buckets > 1
        # each bucket's first reduction plans its shape; the later steps go straight to its shortcut
        assert general == [ReduceOp.AVG] * seen[5] + [ReduceOp.SUM] * seen[11], general
