"""Horovod's Keras API (``allreduce.tensorflow.keras``) on 2 and 3 spawned ranks: ``model.fit`` with the
``DistributedOptimizer`` and the callbacks equals one-rank training on the full batches. Skipped where
TensorFlow is not installed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import keras_ranks
from support.tf_harness import run_scenarios


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def ranks(request) -> list[dict]:
    return run_scenarios([keras_ranks.fit, keras_ranks.warmup], request.param)


def test_fit_on_several_ranks_equals_one_rank_on_the_full_batch(ranks):
    for result in ranks:
        got = result["fit"]
        for distributed, alone in zip(got["distributed"], got["alone"]):
            np.testing.assert_allclose(distributed, alone, rtol=0, atol=1e-6)
    assert all(r["fit"]["loss"] == ranks[0]["fit"]["loss"] for r in ranks)  # averaged by MetricAverageCallback


def test_learning_rate_warmup_then_a_schedule(ranks):
    size = len(ranks)
    expected = [0.4 / size * (epoch * (size - 1) / 2 + 1) for epoch in (0, 0.5, 1, 1.5)]
    expected += [0.4 * 0.5] * 2  # the schedule from epoch 2 on
    for result in ranks:
        np.testing.assert_allclose(result["warmup"], expected, rtol=1e-6)
