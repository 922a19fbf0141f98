"""Elastic training under torchrun on backend "allreduce": a checkpoint every step, resumed after a restart.

    torchrun --nnodes 1:2 --nproc-per-node 2 --max-restarts 3 --rdzv-backend c10d \\
        --rdzv-endpoint localhost:29400 examples/elastic_torchrun.py --checkpoint ckpt.pt --steps 20

When a worker dies, torchrun stops the other workers and starts them all again (it counts restarts in
``TORCHELASTIC_RESTART_COUNT``, up to ``--max-restarts``). Each new worker loads the last checkpoint and
carries on from the step after it. Every step's data depends only on the step and the rank, so the
run ends with the parameters an uninterrupted run ends with. ``--fail-at STEP`` makes rank 1 of the
first attempt SIGKILL itself in the middle of that step (after its forward pass), to watch it happen.
Rank 0 prints the final parameters as JSON (``--out`` also writes them to a file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

IN, HIDDEN = 8, 16


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of step ``step``: the same whichever attempt computes it."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, IN, generator=generator)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def save(path: str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write the checkpoint beside ``path``, then rename it over: a reader sees the old one or the new one."""
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="file of the last completed step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-at", type=int, default=-1, help="rank 1 of the first attempt dies in this step")
    parser.add_argument("--out", help="write the final parameters here (rank 0)")
    args = parser.parse_args()

    dist.init_process_group("allreduce")
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model, start = make_model(), 0
    optimizer = make_optimizer(model)
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    print(f"rank {rank}/{dist.get_world_size()}: attempt {attempt} starts at step {start}\n", end="", flush=True)
    ddp = DistributedDataParallel(model)
    for step in range(start, args.steps):
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if step == args.fail_at and attempt == 0 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
        if rank == 0:
            save(args.checkpoint, step + 1, model, optimizer)
    if rank == 0:
        final = {name: p.detach().tolist() for name, p in model.named_parameters()}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(final, f)
        print(json.dumps({"attempt": attempt, "parameters": final}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
