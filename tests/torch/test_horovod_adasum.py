"""Adasum (Maleki et al., MLSys 2021): its defining formula, its tree, and the op on 2, 3 and 4 ranks.

The reference here is written independently of :mod:`allreduce.torch.horovod.adasum`, in numpy: the pairwise
formula ``(1 - a·b / 2‖a‖²) a + (1 - a·b / 2‖b‖²) b``, applied to neighbours of a list that halves
until one vector is left (a power of two), after folding the ranks past the largest power of two into
the first ones.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

import torch

from support.hvd_harness import run_hvd
from support.torch_harness import model

import allreduce.torch as hvd
from allreduce.torch.horovod import adasum


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot = a @ b
    return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b


def reference(vectors: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    """The Adasum of ``vectors``, each segment (of ``sizes``) on its own."""
    cuts = np.cumsum(sizes)[:-1]
    segments = [np.split(v.astype(np.float64), cuts) for v in vectors]
    power = 1 << (len(vectors).bit_length() - 1)
    level = [[pair(a, b) for a, b in zip(segments[i], segments[i + power])] if i + power < len(segments)
             else segments[i] for i in range(power)]
    while len(level) > 1:
        level = [[pair(a, b) for a, b in zip(level[i], level[i + 1])] for i in range(0, len(level), 2)]
    return np.concatenate(level[0])


def combine(a, b) -> torch.Tensor:
    return adasum.tree(torch.tensor(np.stack([a, b]), dtype=torch.float64), [len(a)])


def test_the_pairwise_formula():
    a, b = np.array([3.0, 0.0, 0.0]), np.array([0.0, -2.0, 5.0])
    assert combine(a, b).tolist() == (a + b).tolist()  # orthogonal: the sum
    assert combine(a, a).tolist() == a.tolist()  # identical: the average (the vector itself)
    assert combine(a, np.zeros(3)).tolist() == a.tolist()  # a zero vector changes nothing
    general = np.array([1.0, 2.0, -1.0]), np.array([2.0, 1.0, 0.5])
    np.testing.assert_allclose(combine(*general).numpy(), pair(*general), rtol=1e-15)
    np.testing.assert_allclose(combine(*general).numpy(), np.array([49, 50, -9]) / 24, rtol=1e-15)  # by hand


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 13])
def test_the_tree_matches_the_reference(n):
    rng = np.random.default_rng(n)
    sizes = [7, 1, 12]
    vectors = [rng.normal(size=sum(sizes)) for _ in range(n)]
    got = adasum.tree(torch.tensor(np.stack(vectors)), sizes)
    np.testing.assert_allclose(got.numpy(), reference(vectors, sizes), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_the_op_on_ranks(size):
    def fn(rank, size):
        basis = torch.eye(size)[rank] * (rank + 1)  # orthogonal across ranks
        general = torch.tensor(np.random.default_rng(rank).normal(size=1001))
        parts = [general[:11].float(), general[11:].float().view(99, 10)]
        return (hvd.allreduce(basis, op=hvd.Adasum), hvd.allreduce(torch.full((5,), 2.5), op=hvd.Adasum),
                hvd.allreduce(general, op=hvd.Adasum), hvd.grouped_allreduce(parts, op=hvd.Adasum),
                hvd.synchronize(hvd.allreduce_async(general, op=hvd.Adasum)))

    results = run_hvd(fn, size)
    vectors = [np.random.default_rng(r).normal(size=1001) for r in range(size)]
    whole, per_tensor = reference(vectors, [1001]), reference(vectors, [11, 990])
    for orthogonal, identical, general, grouped, later in results:
        assert orthogonal.tolist() == [float(r + 1) for r in range(size)]
        assert identical.tolist() == [2.5] * 5
        np.testing.assert_allclose(general.numpy(), whole, rtol=1e-12, atol=1e-12)
        flat = torch.cat([g.reshape(-1) for g in grouped]).numpy()
        np.testing.assert_allclose(flat, per_tensor, rtol=1e-5, atol=1e-6)
        assert torch.equal(later, general)
    assert all(torch.equal(r[2], results[0][2]) for r in results)  # the same bits everywhere


def test_the_optimizer_combines_each_parameters_step_by_adasum():
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))

    def local_steps(rank):
        m = model()
        before = [p.detach().clone() for p in m.parameters()]
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(x[rank * 4:(rank + 1) * 4]).square().mean().backward()
        opt.step()
        return [(p.detach() - b).reshape(-1).numpy() for p, b in zip(m.parameters(), before)], before

    def fn(rank, size):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), op=hvd.Adasum)
        m(x[rank * 4:(rank + 1) * 4]).square().mean().backward()
        opt.step()
        with pytest.raises(RuntimeError, match="Adasum"):
            with opt.skip_synchronize():
                pass
        opt.close()
        return [p.detach().clone() for p in m.parameters()]

    results = run_hvd(fn, 2)
    (delta0, before), (delta1, _) = local_steps(0), local_steps(1)
    for params in results:
        for p, b, d0, d1 in zip(params, before, delta0, delta1):
            np.testing.assert_allclose(p.reshape(-1).numpy(), b.reshape(-1).numpy() + reference([d0, d1], [d0.size]),
                                       rtol=1e-5, atol=1e-7)
