"""Helpers for the torch tests: single-threaded forked ranks, a tiny model, synthetic data.

Ranks are forked by :func:`harness.run_ranks`. torch's OpenMP pool does not survive a fork, so the
test process and every rank use one intra-op thread (the machine has two cores and runs up to four
ranks anyway), and torch's lazy imports happen here, once, before the forks.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback

import numpy as np
import torch

from support.harness import Hung, RankFailed, free_port, run_ranks as _run_ranks

torch.set_num_threads(1)
# The first optimizer a process builds imports torch._dynamo (seconds); do it once here, before the
# forks, rather than once in every rank.
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

IN, HIDDEN, OUT = 8, 16, 4


def run_ranks(fn, size: int, **kwargs):
    """:func:`harness.run_ranks` with torch limited to one thread in each rank."""

    def single_threaded(rank, world):
        torch.set_num_threads(1)
        return fn(rank, world)

    return _run_ranks(single_threaded, size, **kwargs)


def run_torch_ranks(fn, size: int, backend: str = "allreduce", **kwargs):
    """Ranks joined by ``torch.distributed.init_process_group(backend)`` (not allreduce's own)."""
    port = free_port()

    def joined(rank, world):
        import torch.distributed as dist

        import allreduce.torch  # noqa: F401  (registers the backend)

        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        try:
            return fn(rank, world)
        finally:
            dist.destroy_process_group()

    return run_ranks(joined, size, init=False, **kwargs)


def run_spawned(fn, size: int, backend: str = "allreduce", deadline: float = 120.0):
    """Like :func:`run_torch_ranks`, in *spawned* ranks (fresh interpreters): for CUDA, which a forked
    child cannot use once the parent has touched it. ``fn`` must be a module-level function."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_spawned, args=(fn, rank, size, backend, port, results), daemon=True)
             for rank in range(size)]
    for p in procs:
        p.start()
    outcome = {}
    try:
        for _ in range(size):
            rank, ok, value = results.get(timeout=deadline)
            outcome[rank] = (ok, value)
    except queue.Empty:
        raise Hung(f"spawned ranks {sorted(set(range(size)) - set(outcome))} did not finish in {deadline}s") from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    errors = {r: value for r, (ok, value) in outcome.items() if not ok}
    if errors:
        raise RankFailed(errors)
    return [outcome[r][1] for r in range(size)]


def _spawned(fn, rank, size, backend, port, results):
    try:
        import torch.distributed as dist

        import allreduce.torch  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
        try:
            results.put((rank, True, fn(rank, size)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which raises RankFailed
        results.put((rank, False, (type(exc).__name__, str(exc), traceback.format_exc())))


def model(seed: int = 0) -> torch.nn.Module:
    """A small MLP, the same on every rank for the same seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batches(steps: int, batch: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` global batches of synthetic classification data (inputs, labels)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(IN, OUT, generator=g)
    out = []
    for _ in range(steps):
        x = torch.randn(batch, IN, generator=g)
        out.append((x, (x @ teacher).argmax(1)))
    return out


def shard(batch: tuple[torch.Tensor, torch.Tensor], rank: int, size: int):
    """Rank ``rank``'s contiguous share of a global batch."""
    x, y = batch
    n = x.shape[0] // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def train(m: torch.nn.Module, opt, data, rank: int = 0, size: int = 1) -> None:
    """One optimizer step per batch on this rank's share, mean cross-entropy loss."""
    loss_fn = torch.nn.CrossEntropyLoss()
    for batch in data:
        x, y = shard(batch, rank, size)
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()


def weights(m: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)
