"""One rank of a DeepSpeed job: a small MLP trained with ZeRO stages 1, 2 and 3 and DeepSpeedCPUAdam.

Run under a launcher (``allreduce run -n 2 -- python deepspeed_worker.py BACKEND OUT``); rank 0
writes every stage's final parameters to ``OUT`` (an ``.npz``), for tests/torch/test_deepspeed.py
to compare between backends bit for bit. One job per backend: DeepSpeed keeps the process groups it
made, so the default group cannot be swapped under it.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np
import torch

import deepspeed
from deepspeed.ops.adam import DeepSpeedCPUAdam

import allreduce.torch  # noqa: F401  (registers the backend)

STEPS, BATCH, IN, HIDDEN, OUT = 8, 8, 16, 32, 4


def config(stage: int) -> dict:
    """ZeRO at ``stage`` with the optimizer's state offloaded to the CPU, as DeepSpeedCPUAdam wants."""
    zero = {"stage": stage, "offload_optimizer": {"device": "cpu"}}
    if stage == 3:
        zero["offload_param"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "zero_optimization": zero, "zero_allow_untested_optimizer": True}


def train(stage: int, rank: int) -> dict[str, np.ndarray]:
    """``STEPS`` steps on this rank's share of a seeded stream; the full parameters at the end."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    optimizer = DeepSpeedCPUAdam(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config(stage))
    data = torch.Generator().manual_seed(1 + rank)
    for _ in range(STEPS):
        x = torch.randn(BATCH, IN, generator=data)
        y = torch.randint(0, OUT, (BATCH,), generator=data)
        engine.backward(torch.nn.functional.cross_entropy(engine(x), y))
        engine.step()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
        return {f"{stage}.{name}": p.detach().clone().numpy() for name, p in engine.module.named_parameters()}


def main(backend: str, out: str) -> None:
    deepspeed.init_distributed(dist_backend=backend)
    rank = torch.distributed.get_rank()
    params = {}
    for stage in (1, 2, 3):
        params.update(train(stage, rank))
    if rank == 0:
        np.savez(out, **params)


if __name__ == "__main__":
    main(*sys.argv[1:])
