"""Latency of small all-reduces: allreduce against Open MPI (mpi4py) and Gloo (torch), interleaved.

Each round starts every library once per (ranks, bytes) case; each start times ``iters`` float32 SUM
all-reduces in batches and reports rank 0's median wall time and CPU time per call. The table shows
the median over rounds, so a burst of load hits all libraries alike. Nothing runs on import.

    python benchmarks/small_latency.py --ranks 2 4 --bytes 8 1024 --rounds 5
    python benchmarks/small_latency.py --libs allreduce --profile   # cProfile of rank 0, allreduce only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

BATCH = 50  # calls per timed batch


def _time_calls(call, iters: int) -> tuple[float, float, float]:
    """Seconds per call: the median wall and CPU time over batches of ``BATCH`` calls, and the tenth
    percentile of single calls (what a call costs while every rank holds a core, on a busy machine)."""
    walls, cpus, single = [], [], []
    clock = time.perf_counter
    for _ in range(iters // 2):
        start = clock()
        call()
        single.append(clock() - start)
    for _ in range(max(1, iters // BATCH)):
        w, c = time.perf_counter(), time.process_time()
        for _ in range(BATCH):
            call()
        walls.append((time.perf_counter() - w) / BATCH)
        cpus.append((time.process_time() - c) / BATCH)
    return statistics.median(walls), statistics.median(cpus), statistics.quantiles(single, n=10)[0]


def _allreduce_rank(rank: int, size: int, port: int, nbytes: int, iters: int, profile: bool, out) -> None:
    import numpy as np

    import allreduce as dist

    dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=60)
    x = np.zeros(max(1, nbytes // 4), np.float32)
    for _ in range(500):
        dist.all_reduce(x)
    if profile and rank == 0:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        result = _time_calls(lambda: dist.all_reduce(x), iters)
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(18)
    else:
        result = _time_calls(lambda: dist.all_reduce(x), iters)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.put(result)


def _gloo_rank(rank: int, size: int, port: int, nbytes: int, iters: int, profile: bool, out) -> None:
    import torch
    import torch.distributed as tdist

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    x = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    for _ in range(50):
        tdist.all_reduce(x)
    result = _time_calls(lambda: tdist.all_reduce(x), max(BATCH, iters // 10))
    tdist.barrier()
    tdist.destroy_process_group()
    if rank == 0:
        out.put(result)


def _forked(target, size: int, nbytes: int, iters: int, profile: bool) -> tuple[float, float, float]:
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, size, port, nbytes, iters, profile, out)) for r in range(size)]
    for p in procs:
        p.start()
    result = out.get(timeout=300)
    for p in procs:
        p.join(60)
    return result


def _mpi_main(nbytes: int, iters: int) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    x = np.zeros(max(1, nbytes // 4), np.float32)
    y = np.empty_like(x)
    for _ in range(500):
        comm.Allreduce(x, y)
    result = _time_calls(lambda: comm.Allreduce(x, y), iters)
    comm.Barrier()
    if comm.rank == 0:
        print(json.dumps(result))


def _one(lib: str, size: int, nbytes: int, iters: int, profile: bool) -> tuple[float, float, float]:
    """One start of ``lib`` on ``size`` ranks; rank 0's times per call (see :func:`_time_calls`)."""
    if lib == "mpi":
        mpirun = shutil.which("mpirun")
        out = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-n", str(size), sys.executable,
                              __file__, "--mpi-worker", str(nbytes), str(iters)],
                             capture_output=True, text=True, timeout=300, check=True)
        return tuple(json.loads(out.stdout.strip().splitlines()[-1]))
    target = _allreduce_rank if lib == "allreduce" else _gloo_rank
    return _forked(target, size, nbytes, iters, profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--bytes", type=int, nargs="+", default=[8])
    parser.add_argument("--libs", nargs="+", default=["allreduce", "mpi", "gloo"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=4000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--mpi-worker", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mpi_worker:
        _mpi_main(*args.mpi_worker)
        return
    seen: dict[tuple, list] = {}
    for _ in range(args.rounds):
        for size in args.ranks:
            for nbytes in args.bytes:
                for lib in args.libs:
                    seen.setdefault((size, nbytes, lib), []).append(_one(lib, size, nbytes, args.iters, args.profile))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; median of {args.rounds} rounds")
    print(f"{'ranks':>5} {'bytes':>7} {'library':>10} {'wall us':>9} {'cpu us':>8} {'p10 us':>8} {'x MPI':>7} "
          f"{'/ Gloo':>7}")
    for (size, nbytes, lib), runs in seen.items():
        wall = statistics.median(r[0] for r in runs) * 1e6
        cpu = statistics.median(r[1] for r in runs) * 1e6
        fast = statistics.median(r[2] for r in runs) * 1e6
        mpi = seen.get((size, nbytes, "mpi"))
        gloo = seen.get((size, nbytes, "gloo"))
        x_mpi = f"{wall / (statistics.median(r[0] for r in mpi) * 1e6):7.1f}" if mpi else f"{'-':>7}"
        of_gloo = f"{(statistics.median(r[0] for r in gloo) * 1e6) / wall:7.1f}" if gloo else f"{'-':>7}"
        print(f"{size:>5} {nbytes:>7} {lib:>10} {wall:9.2f} {cpu:8.2f} {fast:8.2f} {x_mpi} {of_gloo}")


if __name__ == "__main__":
    main()
