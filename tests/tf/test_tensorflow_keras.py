"""Horovod's Keras API (``allreduce.tensorflow.keras``) on 2 spawned ranks: ``model.fit`` with the
``DistributedOptimizer`` and the callbacks equals one-rank training on the full batches. Skipped where
TensorFlow is not installed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import keras_ranks
from support.tf_harness import run_scenarios

SIZE = 2


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_scenarios([keras_ranks.fit, keras_ranks.warmup], SIZE)


def test_fit_on_two_ranks_equals_one_rank_on_the_full_batch(ranks):
    for result in ranks:
        got = result["fit"]
        for distributed, alone in zip(got["distributed"], got["alone"]):
            np.testing.assert_allclose(distributed, alone, rtol=0, atol=1e-6)
    assert ranks[0]["fit"]["loss"] == ranks[1]["fit"]["loss"]  # averaged by MetricAverageCallback


def test_learning_rate_warmup_then_a_schedule(ranks):
    expected = [0.4 / SIZE * (epoch * (SIZE - 1) / 2 + 1) for epoch in (0, 0.5, 1, 1.5)]
    expected += [0.4 * 0.5] * 2  # the schedule from epoch 2 on
    for result in ranks:
        np.testing.assert_allclose(result["warmup"], expected, rtol=1e-6)
