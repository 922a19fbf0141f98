"""Ranks as Ray actors (``allreduce.ray``) and Ray Train's TorchTrainer on backend "allreduce".

One local Ray runtime (two CPUs) serves the module; without Ray (the optional ``ray`` extra, ``make
ray``) the module is skipped. The 4-actor group and Ray Train are slow (``make deploy-test``).
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'allreduce[ray]' (make ray)")
pytest.importorskip("torch")

from allreduce.ray import destroy_group, form_group  # noqa: E402

DEADLINE_S = 120  # every ray.get below; the group's own timeout is shorter


@pytest.fixture(scope="module")
def runtime():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this file
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"ALLREDUCE_SECRET": secrets.token_hex(16)}})
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class Rank:
    """A user's actor: knows nothing of rendezvous, calls the collectives once its group exists."""

    def sums(self, counts: list[int]) -> tuple[int, int, list[np.ndarray]]:
        import allreduce as dist

        rank = dist.get_rank()
        results = []
        for count in counts:
            x = np.arange(count, dtype=np.float64) * (rank + 1)
            dist.all_reduce(x)
            results.append(x)
        return rank, dist.get_world_size(), results


@pytest.mark.parametrize("size", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_actors_form_a_group_through_ray(runtime, size):
    actors = [Rank.remote() for _ in range(size)]
    try:
        form_group(actors, timeout=60)
        counts = [1, 3, 1000, 100_003]
        answers = ray.get([actor.sums.remote(counts) for actor in actors], timeout=DEADLINE_S)
        destroy_group(actors, timeout=60)
    finally:
        for actor in actors:
            ray.kill(actor)
    assert [(rank, world) for rank, world, _ in answers] == [(r, size) for r in range(size)]
    for _, _, results in answers:
        for count, got in zip(counts, results):
            np.testing.assert_array_equal(got, np.arange(count, dtype=np.float64) * size * (size + 1) / 2)


def _train_loop(config: dict) -> None:
    """Plain torch DDP: nothing in it imports allreduce; TorchConfig chose the backend."""
    import torch
    import torch.distributed as tdist

    torch.manual_seed(0)  # the same initial model everywhere; DDP broadcasts it anyway
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank, size = tdist.get_rank(), tdist.get_world_size()
    data = torch.Generator().manual_seed(1)
    inputs = torch.randn(16, 4, generator=data)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for _ in range(config["steps"]):
        mine = slice(rank * 16 // size, (rank + 1) * 16 // size)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[mine]), targets[mine]).backward()
        optimizer.step()
    result = {"backend": tdist.get_backend(), "size": size, "weight": model.module.weight.detach().flatten().tolist(),
              "bias": model.module.bias.item()}
    (Path(config["out"]) / f"rank{rank}.json").write_text(json.dumps(result))


def _serial_reference(steps: int, size: int) -> tuple[list[float], float]:
    """The same training on one process: the mean of the ranks' gradients is the full batch's."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for _ in range(steps):
        optimizer.zero_grad()
        losses = [torch.nn.functional.mse_loss(model(inputs[r * 16 // size:(r + 1) * 16 // size]),
                                               targets[r * 16 // size:(r + 1) * 16 // size]) for r in range(size)]
        (sum(losses) / size).backward()
        optimizer.step()
    return model.weight.detach().flatten().tolist(), model.bias.item()


@pytest.mark.slow  # a minute: Ray Train starts its controller and workers
def test_ray_train_torch_trainer_on_backend_allreduce(runtime, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(_train_loop, train_loop_config={"steps": 5, "out": str(tmp_path)},
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                           torch_config=TorchConfig(backend="allreduce", timeout_s=60),
                           run_config=RunConfig(storage_path=str(tmp_path), name="allreduce"))
    assert trainer.fit().error is None
    weight, bias = _serial_reference(5, 2)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert (got["backend"], got["size"]) == ("allreduce", 2)
        np.testing.assert_allclose(got["weight"], weight, rtol=1e-5, atol=1e-6)
        assert got["bias"] == pytest.approx(bias, rel=1e-5, abs=1e-6)
