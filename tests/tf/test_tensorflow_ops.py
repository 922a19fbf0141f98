"""Horovod's TensorFlow API (``allreduce.tensorflow``) on 2 spawned ranks, against numpy references:
the operations eager and in ``tf.function``, their gradients, ``DistributedGradientTape``, the
refusal of ``jit_compile=True``. Skipped where TensorFlow is not installed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from support.tf_harness import run_scenarios

import tf_ranks
from tf_ranks import values

SIZE = 2
SCENARIOS = [tf_ranks.basics, tf_ranks.reductions, tf_ranks.in_function, tf_ranks.gathers, tf_ranks.variables,
             tf_ranks.gradients, tf_ranks.sparse, tf_ranks.xla, tf_ranks.tape_training,
             tf_ranks.partial_tape]


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_scenarios(SCENARIOS, SIZE)


def every(ranks, scenario):
    return [(rank, result[scenario]) for rank, result in enumerate(ranks)]


def test_where_each_rank_sits(ranks):
    for rank, got in every(ranks, "basics"):
        assert got == [rank, SIZE, rank, SIZE, 0, 1, True]


def test_allreduce_ops_factors_and_compression(ranks):
    xs = np.stack([values(r) for r in range(SIZE)])
    for _, got in every(ranks, "reductions"):
        np.testing.assert_array_equal(got["Average"], xs.sum(0) / SIZE)
        np.testing.assert_array_equal(got["Sum"], xs.sum(0))
        np.testing.assert_array_equal(got["Min"], xs.min(0))
        np.testing.assert_array_equal(got["Max"], xs.max(0))
        np.testing.assert_array_equal(got["Product"], xs.prod(0))
        np.testing.assert_array_equal(got["int_average"], [1, -1])  # Horovod's: int(3 * 0.5), truncated
        np.testing.assert_allclose(got["scaled"], (xs * 0.5).sum(0) * 3.0, rtol=1e-6)
        np.testing.assert_allclose(got["fp16"], xs.sum(0), rtol=1e-3)
        np.testing.assert_allclose(got["bf16"], xs.mean(0), rtol=1e-2)
        assert got["fp16"].dtype == np.float32
        np.testing.assert_array_equal(got["grouped"][0], xs.sum(0))
        np.testing.assert_array_equal(got["grouped"][1], xs[:, 0].sum(0) * 2)


def test_operations_inside_tf_function(ranks):
    xs = [values(r) for r in range(SIZE)]
    for _, (summed, largest, gathered, broadcast) in every(ranks, "in_function"):
        np.testing.assert_array_equal(summed, sum(xs))
        np.testing.assert_array_equal(largest, np.max(xs, axis=0) * 2)
        np.testing.assert_array_equal(gathered, np.concatenate(xs))
        np.testing.assert_array_equal(broadcast, xs[1])


def test_gathers_scatters_and_objects(ranks):
    inputs = [np.arange(3 * SIZE) + 10 * r for r in range(SIZE)]
    splits = [1 + r for r in range(SIZE - 1)] + [3 * SIZE - sum(1 + r for r in range(SIZE - 1))]
    bounds = np.cumsum([0] + splits)
    total = sum(values(r) for r in range(SIZE))
    for rank, got in every(ranks, "gathers"):
        np.testing.assert_array_equal(got["allgather"], np.concatenate([np.full((r + 1, 2), r) for r in range(SIZE)]))
        np.testing.assert_array_equal(got["broadcast"], [1])
        np.testing.assert_array_equal(got["alltoall"],
                                      np.concatenate([x[bounds[rank]:bounds[rank + 1]] for x in inputs]))
        np.testing.assert_array_equal(got["received"], [splits[rank]] * SIZE)
        np.testing.assert_array_equal(got["reducescatter"], total[rank:rank + 1])
        np.testing.assert_array_equal(got["reducescatter_uneven"], np.full((2 - rank, 2), 1.5))
        gathered = [np.full((r + 1, 2), r) for r in range(SIZE)]
        np.testing.assert_array_equal(got["grouped_allgather"][0], np.concatenate(gathered))
        np.testing.assert_array_equal(got["grouped_allgather"][1], np.concatenate([g[:1] * 2 for g in gathered]))
        np.testing.assert_array_equal(got["grouped_reducescatter"][0], [[sum(range(SIZE))]])
        assert got["object"] == {"rank": 1} and got["objects"] == list(range(SIZE))


def test_broadcast_variables(ranks):
    for _, got in every(ranks, "variables"):
        np.testing.assert_array_equal(got[0], values(1))
        assert got[1].tolist() == [1] and got[2] == 1.0


def test_gradients_of_allreduce_allgather_broadcast_reducescatter(ranks):
    for rank, (of_sum, of_gather, of_broadcast, of_scatter) in every(ranks, "gradients"):
        np.testing.assert_array_equal(of_sum, SIZE * values(0))
        np.testing.assert_array_equal(of_gather, 2 * values(rank))  # Horovod's: the averaged gradient's rows
        np.testing.assert_array_equal(of_broadcast, np.full((2, 3), 3.0 if rank == 0 else 0.0))
        np.testing.assert_array_equal(of_scatter, np.full((2, 3), float(SIZE)))  # Horovod's: times the size for Sum


def test_indexed_slices_are_gathered(ranks):
    for _, (grad_values, indices) in every(ranks, "sparse"):
        np.testing.assert_array_equal(indices, [i for r in range(SIZE) for i in (r, 4)])
        np.testing.assert_array_equal(grad_values, [[r + 1.0] * 2 for r in range(SIZE) for _ in range(2)])


def test_jit_compile_is_refused_clearly(ranks):
    for _, message in every(ranks, "xla"):
        assert message is not None and "jit_compile" in message


def test_gradient_tape_training_equals_full_batch(ranks):
    data = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    target = data @ np.array([[1.0], [-2.0], [0.5]], np.float32)
    w = np.zeros((3, 1), np.float64)
    for _ in range(5):
        w -= 0.1 * 2 / 8 * data.T @ (data @ w - target)
    for _, got in every(ranks, "tape_training"):
        np.testing.assert_allclose(got, w, atol=1e-6)


def test_partial_tape_keeps_local_gradients_local(ranks):
    for rank, (shared, local) in every(ranks, "partial_tape"):
        np.testing.assert_array_equal(shared, [sum(range(1, SIZE + 1)) / SIZE] * 2)
        np.testing.assert_array_equal(local, [rank + 1.0])
