"""Data-parallel training of a small MLP on synthetic data: allreduce's optimizer, or torch DDP.

Run it with ``allreduce run -n 4 -- python examples/train.py`` (``make demo`` does), or with
``torchrun --nproc-per-node 4 examples/train.py`` (the ranks then meet through
``torch.distributed.init_process_group("allreduce")``, which the optimizer uses too). Every rank
builds the same data set (a fixed random "teacher" network labels random inputs), takes its share of
every batch and averages gradients with the others; rank 0 prints the loss (averaged over ranks) and
the samples per second of the whole job after each epoch.

    --compression fp16      gradients travel as float16 (summed in float32)
    --ddp gloo              torch DistributedDataParallel on torch's Gloo backend instead
    --ddp allreduce         DistributedDataParallel on the "allreduce" torch.distributed backend
    --alone                 no averaging: each rank trains on its share alone (what the compute costs)
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import allreduce
import allreduce.torch as art

COMPRESSIONS = {"none": art.Compression.none, "fp16": art.Compression.fp16, "bf16": art.Compression.bf16}
FEATURES, CLASSES = 32, 10


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16384, help="data set size")
    parser.add_argument("--batch-size", type=int, default=256, help="global batch, split across ranks")
    parser.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--compression", choices=[*COMPRESSIONS, "fp16-ef", "bf16-ef"], default="none")
    parser.add_argument("--fusion-mb", type=float, default=25.0, help="gradient bucket size (both modes)")
    parser.add_argument("--ddp", choices=["gloo", "allreduce"], help="use torch DDP on this backend instead")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--alone", action="store_true", help="no gradient averaging: the compute alone")
    return parser.parse_args()


def make_data(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    teacher = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, CLASSES))
    for p in teacher.parameters():
        p.data = torch.randn(p.shape, generator=g)
    x = torch.randn(samples, FEATURES, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(1)
    return x, y


def make_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES))


def compression(name: str):
    base = COMPRESSIONS[name.removesuffix("-ef")]
    return art.Compression.error_feedback(base) if name.endswith("-ef") else base


def join(args: argparse.Namespace):
    """Meet the other ranks; return (rank, size, average-over-ranks function, leave function)."""
    # torchrun's agent holds MASTER_PORT with torch's own store: meet through torch.distributed there
    if args.ddp or "TORCHELASTIC_RUN_ID" in os.environ:
        import torch.distributed as dist

        dist.init_process_group(args.ddp or "allreduce")
        size = dist.get_world_size()

        def average(value: float) -> float:
            t = torch.tensor([value])
            dist.all_reduce(t)
            return t.item() / size

        return dist.get_rank(), size, average, dist.destroy_process_group
    allreduce.init_process_group()
    size = allreduce.get_world_size()

    def mean(value: float) -> float:
        return allreduce.all_reduce_scalar(value) / size

    return allreduce.get_rank(), size, mean, allreduce.destroy_process_group


def distribute(model: torch.nn.Module, args: argparse.Namespace):
    """(model, optimizer) that average gradients: torch DDP, or allreduce's DistributedOptimizer."""
    if args.alone:
        return model, torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.fusion_mb)
        return model, torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # on allreduce's default group, or on torch's when it runs the "allreduce" backend
    art.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, art.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                           named_parameters=model.named_parameters(),
                                           compression=compression(args.compression),
                                           fusion_threshold_mb=args.fusion_mb)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rank, size, average, leave = join(args)
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by the number of ranks ({size})")
    model, optimizer = distribute(make_model(args.hidden), args)
    x, y = make_data(args.samples)
    share = args.batch_size // size
    steps = args.samples // args.batch_size
    loss_fn = torch.nn.CrossEntropyLoss()
    mode = "no averaging" if args.alone else f"DDP on {args.ddp}" if args.ddp else \
        f"DistributedOptimizer, compression {args.compression}"
    if rank == 0:
        print(f"{size} ranks, {mode}: {steps} steps of {args.batch_size} samples per epoch")
    for epoch in range(1, args.epochs + 1):
        start, total = time.perf_counter(), 0.0
        for step in range(steps):
            lo = step * args.batch_size + rank * share  # this rank's share of the global batch
            optimizer.zero_grad()
            loss = loss_fn(model(x[lo:lo + share]), y[lo:lo + share])
            loss.backward()
            optimizer.step()
            total += loss.item()
        rate = steps * args.batch_size / (time.perf_counter() - start)
        loss = average(total / steps)
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}  loss {loss:.4f}  samples/s {rate:.0f}", flush=True)
    if not (args.ddp or args.alone):
        optimizer.close()
    leave()


if __name__ == "__main__":
    main()
