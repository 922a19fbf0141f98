"""A torchrun worker of tests/torch/test_torch_shrink.py: DDP training where rank ``--victim`` SIGKILLs itself
at step ``--kill-at``; the others call ``torch.distributed.shrink_group([victim])``, rebuild DDP on the shrunk
default group, redo the step that failed and finish. Each survivor writes its parameters to
``--out/rank<R>.json`` (R: its rank when the job began).

The model, data and optimizer are :func:`make_model`, :func:`batch` and plain SGD, which the test
replays in one process to compute what the survivors must end with.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import allreduce.torch  # noqa: F401  (registers the backend)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of the rank that was ``rank`` when the job began, at ``step``."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument("--victim", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("allreduce")
    me = dist.get_rank()
    model = make_model()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step, shrunk_at = 0, None
    while step < args.steps:
        if me == args.victim and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step, me)
        optimizer.zero_grad()
        try:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        except Exception:  # the victim's death, as DDP's reducer raises it
            dist.shrink_group([args.victim])
            ddp = DistributedDataParallel(model)  # on the new default group
            shrunk_at = step
            continue
        optimizer.step()
        step += 1
    result = {"rank": me, "size": dist.get_world_size(), "shrunk_at": shrunk_at,
              "params": {name: p.detach().tolist() for name, p in model.named_parameters()}}
    with open(os.path.join(args.out, f"rank{me}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
