"""What the torch backend adds to a small all-reduce: ``dist.all_reduce`` against our numpy API, same group.

Both ranks form one torch group on backend "allreduce"; its allreduce group is also used directly
through ``allreduce.all_reduce`` on a numpy array of the same size. So the two calls share transport,
algorithm and peer, and their difference is the torch side alone (torch's dispatch, the C++ shim,
the backend's Python method and its work object). Batches of the calls below alternate, and
the table shows rank 0's median wall and CPU time per call. Nothing runs on import.

    python benchmarks/torch_overhead.py                  # 8 bytes, 2 ranks
    python benchmarks/torch_overhead.py --bytes 8 4096 --profile   # cProfile of rank 0's torch calls
    python benchmarks/torch_overhead.py --layers         # the layers of one call, one process
    python benchmarks/torch_overhead.py --hvd            # Horovod's hvd.allreduce against the numpy API

- ``numpy``: ``allreduce.all_reduce(array, group=g)``;
- ``tensor``: ``allreduce.all_reduce(tensor, group=g)``, our API on the torch tensor (a numpy view per call);
- ``torch``: ``torch.distributed.all_reduce(tensor)`` on backend "allreduce";
- ``backend``: the backend's own ``allreduce([tensor], opts)`` as torch's dispatch calls it (blocking), so
  ``torch`` minus ``backend`` is torch's layer and ``backend`` minus ``numpy`` the shim's;
- ``optimizer``: a backward pass whose gradient ``allreduce.torch.DistributedOptimizer`` reduces
  (on its communication thread), then ``synchronize()``;
- ``backward``: the same backward pass with no optimizer, to subtract from ``optimizer``.

``--hvd`` forms allreduce's default group instead, which ``hvd.init()`` adopts, and times on it:

- ``numpy``: ``allreduce.all_reduce(array)`` (Sum);
- ``hvd Sum``: ``hvd.allreduce(tensor, op=hvd.Sum)``, negotiated, a new tensor per call;
- ``hvd Average``: ``hvd.allreduce(tensor)`` (Horovod's default op);
- ``hvd Sum_``: ``hvd.allreduce_(tensor, op=hvd.Sum)``, in place.

``--layers`` times, in one process of world size 1 (no peer, so only the per-call machinery), the
layers a blocking ``dist.all_reduce`` passes: torch's Python function, the ``ProcessGroup`` call
torch's function makes (``pg.allreduce([t], opts).wait()``) and the backend's own ``allreduce``
called from Python; for backend "allreduce", for Gloo, for backend "allreduce" with a method that
does nothing (``empty``: what torch and the shim cost alone) and with a method that makes the
``numpy API`` row's call (``numpy``: that call inside torch's). It shows thread CPU time per call,
the least of the interleaved batches.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import time

BATCH = 200  # calls per timed batch


def _rank(rank: int, size: int, port: int, nbytes: int, rounds: int, profile: bool, out) -> None:
    import numpy as np
    import torch
    import torch.distributed as tdist

    import allreduce
    import allreduce.torch as atorch

    torch.set_num_threads(1)
    tdist.init_process_group("allreduce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    backend = tdist.group.WORLD._get_backend(torch.device("cpu"))
    group = backend.impl.group
    blocking = tdist.AllreduceOptions()
    blocking.asyncOp = False  # what dist.all_reduce(t) passes
    count = max(1, nbytes // 4)
    array, tensor = np.zeros(count, np.float32), torch.zeros(count)  # sums stay finite
    weight, local = torch.ones(count, requires_grad=True), torch.ones(count, requires_grad=True)
    opt = atorch.DistributedOptimizer(torch.optim.SGD([weight], lr=0.0), group=group)

    def optimizer_step():
        weight.sum().backward()  # the hook hands the gradient to the optimizer's communication thread
        opt.synchronize()

    calls = {"numpy": lambda: allreduce.all_reduce(array, group=group),
             "tensor": lambda: allreduce.all_reduce(tensor, group=group), "torch": lambda: tdist.all_reduce(tensor),
             "backend": lambda: backend.allreduce([tensor], blocking),
             "optimizer": optimizer_step, "backward": lambda: local.sum().backward()}
    seen = _interleaved(calls, rounds, "torch" if profile and rank == 0 else None)
    tdist.barrier()
    tdist.destroy_process_group()
    if rank == 0:
        out.put(seen)


def _hvd_rank(rank: int, size: int, port: int, nbytes: int, rounds: int, profile: bool, out) -> None:
    import numpy as np
    import torch

    import allreduce
    import allreduce.torch as hvd

    torch.set_num_threads(1)
    allreduce.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    hvd.init()  # adopts the default group
    count = max(1, nbytes // 4)
    array, tensor = np.zeros(count, np.float32), torch.zeros(count)  # sums stay finite
    calls = {"numpy": lambda: allreduce.all_reduce(array), "hvd Sum": lambda: hvd.allreduce(tensor, op=hvd.Sum),
             "hvd Average": lambda: hvd.allreduce(tensor), "hvd Sum_": lambda: hvd.allreduce_(tensor, op=hvd.Sum)}
    seen = _interleaved(calls, rounds, "hvd Sum" if profile and rank == 0 else None)
    hvd.shutdown()
    allreduce.destroy_process_group()
    if rank == 0:
        out.put(seen)


def _interleaved(calls: dict, rounds: int, profiled: str | None) -> dict[str, tuple[float, float]]:
    """Median (wall, cpu) seconds per call of each of ``calls``, over ``rounds`` interleaved batches (after a
    warm-up); the call named ``profiled`` runs under cProfile, whose table goes to stderr."""
    for call in calls.values():
        for _ in range(300):
            call()
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    prof = None
    if profiled is not None:
        import cProfile

        prof = cProfile.Profile()
    for _ in range(rounds):
        for name, call in calls.items():
            if prof is not None and name == profiled:
                prof.enable()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(BATCH):
                call()
            seen[name].append(((time.perf_counter() - wall) / BATCH, (time.process_time() - cpu) / BATCH))
            if prof is not None:
                prof.disable()
    if prof is not None:
        import pstats

        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
            for name, runs in seen.items()}


def measure(nbytes: int, size: int, rounds: int, profile: bool, target=_rank) -> dict[str, tuple[float, float]]:
    """Rank 0's median (wall, cpu) seconds per call of each kind, ``size`` forked ranks running ``target``."""
    import multiprocessing as mp

    from allreduce.addresses import free_port

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, size, port, nbytes, rounds, profile, out)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                return out.get(timeout=1)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a rank failed; its traceback is above") from None
        raise TimeoutError("the ranks did not finish within 600 s")
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def layers(rounds: int) -> dict[str, float]:
    """Thread CPU seconds per call of each layer (see the module docstring), least over ``rounds`` batches."""
    import numpy as np
    import torch
    import torch.distributed as tdist

    import allreduce
    from allreduce.addresses import free_port

    torch.set_num_threads(1)
    tdist.init_process_group("allreduce", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    groups = {"allreduce": tdist.group.WORLD, "gloo": tdist.new_group(backend="gloo"),
              "empty": tdist.new_group(backend="allreduce"), "numpy": tdist.new_group(backend="allreduce")}
    backends = {name: pg._get_backend(torch.device("cpu")) for name, pg in groups.items()}
    group = backends["allreduce"].impl.group
    array, tensor = np.zeros(2, np.float32), torch.zeros(2)
    # set before their first calls, which bind them
    backends["empty"].impl.allreduce_now = lambda view, op: None
    backends["numpy"].impl.allreduce_now = lambda view, op: allreduce.all_reduce(array, group=group)
    blocking = tdist.AllreduceOptions()
    blocking.asyncOp = False  # what dist.all_reduce(t) passes
    calls = {"numpy API": lambda: allreduce.all_reduce(array, group=group),
             "numpy API on the tensor": lambda: allreduce.all_reduce(tensor, group=group)}
    for name, pg in groups.items():
        calls[f"{name}: dist.all_reduce"] = lambda pg=pg: tdist.all_reduce(tensor, group=pg)
        calls[f"{name}: ProcessGroup.allreduce"] = lambda pg=pg: pg.allreduce([tensor], blocking).wait()
        calls[f"{name}: Backend.allreduce"] = lambda b=backends[name]: b.allreduce([tensor], blocking)
    seen: dict[str, list[float]] = {name: [] for name in calls}
    for batch in range(rounds + 1):  # the first round warms up
        for name, call in calls.items():
            cpu = time.thread_time()
            for _ in range(BATCH):
                call()
            if batch:
                seen[name].append((time.thread_time() - cpu) / BATCH)
    tdist.destroy_process_group()
    return {name: min(runs) for name, runs in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, nargs="+", default=[8])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=25, help="batches of each call, interleaved")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--layers", action="store_true", help="time the layers of one call instead (one process)")
    parser.add_argument("--hvd", action="store_true", help="time Horovod's hvd.allreduce instead")
    args = parser.parse_args()
    import allreduce.torch  # noqa: F401  (registers the backend and builds its shim before the forks)
    from allreduce.torch.c10d import native

    native.python_backend(os.environ)
    if args.layers:
        print(f"{'layer':>34} {'cpu us':>7}   (load {os.getloadavg()[0]:.2f}, world size 1, least of {args.rounds} "
              f"batches of {BATCH})")
        for name, cpu in layers(args.rounds).items():
            print(f"{name:>34} {cpu * 1e6:7.2f}")
        return
    print(f"{'bytes':>7} {'call':>11} {'wall us':>9} {'cpu us':>8} {'+ wall us':>10}   (load {os.getloadavg()[0]:.2f}, "
          f"{args.ranks} ranks, median of {args.rounds} batches of {BATCH})")
    for nbytes in args.bytes:
        got = measure(nbytes, args.ranks, args.rounds, args.profile, _hvd_rank if args.hvd else _rank)
        base = got["numpy"][0]
        for name, (wall, cpu) in got.items():
            print(f"{nbytes:>7} {name:>11} {wall * 1e6:9.2f} {cpu * 1e6:8.2f} {(wall - base) * 1e6:10.2f}")


if __name__ == "__main__":
    main()
