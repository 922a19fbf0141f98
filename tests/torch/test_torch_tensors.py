"""Torch tensors in the core collectives (in place, no copies) and staging for the rest."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.torch_harness import run_ranks

import allreduce as dist
import allreduce.torch as art
from allreduce.buffers import as_array

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.complex64]


def test_every_shared_dtype_reduces_in_place():
    def fn(rank, size):
        out = {}
        for dtype in DTYPES:
            t = torch.full((5,), rank + 1, dtype=dtype)
            address = t.data_ptr()
            dist.all_reduce(t)
            assert t.data_ptr() == address
            out[str(dtype)] = t.to(torch.complex128 if dtype.is_complex else torch.float64).numpy()
        flags = torch.tensor([rank == 0, True])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        out["bool"] = flags.numpy()
        weight = torch.nn.Parameter(torch.full((2, 2), float(rank)))  # requires grad: viewed, not copied
        dist.all_reduce(weight)
        out["parameter"] = weight.detach().numpy()
        return out

    for out in run_ranks(fn, 2):
        for dtype in DTYPES:
            np.testing.assert_array_equal(out[str(dtype)], np.full(5, 3))
        np.testing.assert_array_equal(out["bool"], [True, True])
        np.testing.assert_array_equal(out["parameter"], np.ones((2, 2)))


def test_the_core_refuses_what_it_cannot_view_in_place():
    def fn(rank, size):
        with pytest.raises(ValueError, match="contiguous"):
            dist.all_reduce(torch.ones(3, 4).t())
        with pytest.raises(ValueError, match="contiguous"):
            dist.broadcast(torch.ones(10)[::2], src=0)
        return True

    assert run_ranks(fn, 2) == [True, True]


def test_staged_tensors_are_direct_when_contiguous_and_copied_back_otherwise():
    t = torch.arange(6.0)
    assert art.Staged(t).direct and art.Staged(t).host is t
    matrix = torch.zeros(3, 4)
    column = matrix[:, 1]
    staged = art.Staged(column)
    assert not staged.direct and staged.host.is_contiguous()
    staged.host.fill_(7.0)
    staged.copy_back()
    assert torch.equal(matrix[:, 1], torch.full((3,), 7.0)) and matrix.sum() == 21.0
    weight = torch.nn.Parameter(torch.zeros(2, 3))
    staged = art.Staged(weight.t())  # a parameter's strided view: copied back without autograd
    staged.host.fill_(1.0)
    staged.copy_back()
    assert torch.equal(weight.detach(), torch.ones(2, 3))
    with pytest.raises(TypeError):
        art.Staged(np.zeros(3))


def test_staged_collectives_on_strided_tensors():
    def fn(rank, size):
        matrix = torch.arange(12.0).view(3, 4) * (rank + 1)
        column = art.Staged(matrix[:, 2])
        dist.all_reduce(column.host)
        column.copy_back()
        return matrix.numpy()

    base = np.arange(12.0).reshape(3, 4)
    for rank, matrix in enumerate(run_ranks(fn, 2)):
        expected = base * (rank + 1)
        expected[:, 2] = base[:, 2] * 3  # only the column was reduced
        np.testing.assert_array_equal(matrix, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_stage_through_pinned_memory():
    t = torch.arange(4.0, device="cuda")
    staged = art.Staged(t)
    assert staged.host.is_pinned() and staged.host.device.type == "cpu" and not staged.direct
    staged.host.mul_(2)
    staged.copy_back()
    assert torch.equal(t.cpu(), torch.arange(4.0) * 2)
    with pytest.raises(TypeError, match="allreduce.torch"):
        as_array(t)
