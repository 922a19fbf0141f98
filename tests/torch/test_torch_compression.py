"""Compressors alone, and the compressed all-reduce: fp16 on the wire, float32 sums, no overflow."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.torch_harness import run_ranks

import allreduce as dist
import allreduce.torch as art
from allreduce import ReduceOp

FP16_MAX = 65504.0


@pytest.mark.parametrize("compressor, wire", [
    (art.Compression.none, torch.float32),
    (art.Compression.fp16, torch.float16),
    (art.Compression.bf16, torch.bfloat16),
])
def test_compressors_cast_floats_and_leave_integers(compressor, wire):
    x = torch.linspace(-3, 3, 7)
    sent, ctx = compressor.compress(x)
    assert sent.dtype == wire and sent.shape == x.shape
    back = compressor.decompress(sent, ctx)
    assert back.dtype == torch.float32
    torch.testing.assert_close(back, x, rtol=2**-7, atol=0)
    counts = torch.arange(5)
    assert compressor.compress(counts)[0].dtype == torch.int64


def test_error_feedback_carries_the_rounding_into_the_next_compression():
    ef = art.Compression.error_feedback(art.Compression.fp16)
    x = torch.full((4,), 1.0 + 2**-13)  # not representable in fp16: each plain cast loses 2**-13
    sent_total = torch.zeros(4, dtype=torch.float64)
    for _ in range(64):
        sent, ctx = ef.compress(x)
        sent_total += ef.decompress(sent, ctx).double()
    exact = 64 * (1.0 + 2**-13)
    assert float((sent_total - exact).abs().max()) <= 2**-10  # at most one rounding behind in total
    plain = 64 * float(art.Compression.fp16.decompress(*art.Compression.fp16.compress(x))[0])
    assert abs(plain - exact) >= 2**-8  # the plain cast drifts by 64 roundings
    assert ef.residual(x) is not None


def test_error_feedback_refuses_to_nest():
    with pytest.raises(TypeError):
        art.Compression.error_feedback(art.Compression.error_feedback(art.Compression.fp16))


def test_sums_of_large_fp16_values_do_not_overflow():
    def fn(rank, size):
        big = torch.full((1001,), 40000.0)  # fits fp16; four of them summed do not
        naive = big.to(torch.float16)
        dist.all_reduce(naive)  # summed on the wire in fp16
        total = big.clone()
        art.reduce_flat(total, art.Compression.fp16, ReduceOp.SUM)
        mean = big.clone()
        art.reduce_flat(mean, art.Compression.fp16, ReduceOp.AVG)
        half = big.to(torch.float16)  # a half-precision buffer itself, no compressor
        art.reduce_flat(half, art.Compression.none, ReduceOp.AVG)
        brain = torch.full((7,), 8.0e37)  # four of them sum to near float32's (and bfloat16's) limit
        art.reduce_flat(brain, art.Compression.bf16, ReduceOp.SUM)
        return bool(torch.isinf(naive).all()), total.numpy(), mean.numpy(), half.float().numpy(), brain.numpy()

    for naive_overflowed, total, mean, half, brain in run_ranks(fn, 4):
        assert naive_overflowed
        assert np.all(total == 160000.0) and 160000.0 > FP16_MAX
        assert np.all(mean == 40000.0) and np.all(half == 40000.0)
        assert np.all(np.isfinite(brain)) and np.allclose(brain, 3.2e38, rtol=2**-7)


def test_compressed_reduction_of_sizes_that_do_not_split_evenly():
    def fn(rank, size):
        out = {}
        for n in (0, 1, 2, 5, 1000):
            x = torch.arange(n, dtype=torch.float32) * (rank + 1)
            art.reduce_flat(x, art.Compression.fp16, ReduceOp.SUM)
            out[n] = x.numpy()
        return out

    for out in run_ranks(fn, 3):
        for n, x in out.items():
            expected = np.arange(n, dtype=np.float32) * 6  # 1 + 2 + 3
            np.testing.assert_allclose(x, expected, rtol=2**-10)


def test_reduce_flat_rejects_other_ops_and_shapes():
    with pytest.raises(ValueError, match="SUM"):
        art.reduce_flat(torch.zeros(3), art.Compression.none, ReduceOp.MAX)
    with pytest.raises(ValueError, match="1-D"):
        art.reduce_flat(torch.zeros(2, 2), art.Compression.none, ReduceOp.SUM)
