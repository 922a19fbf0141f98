"""allreduce against torch.distributed's Gloo and Open MPI (mpi4py), side by side, in one run.

    python benchmarks/compare.py                       # 2 and 4 ranks, 8 B .. 256 MiB, 3 rounds
    python benchmarks/compare.py -n 2 --max-bytes 64M --rounds 2 --plot out/compare.png

Every system runs the same float32 SUM all-reduce sweep; the systems take turns round by round (so a
noisy minute hurts all of them alike) and each size keeps its best round. The table gives latency,
busbw (nccl-tests' 2(n-1)/n factor) and the ratio allreduce/peer (>1 means allreduce is faster), and
the machine's own limits measured in the same run: memory copy bandwidth (np.copyto of 256 MiB) and
loopback TCP throughput. Systems that are not installed are skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.abspath(__file__)
SYSTEMS = ("allreduce", "gloo", "mpi")


# ---- workers: one process per rank, each prints nothing but rank 0's JSON line ------------------

def _iterations(nbytes: int) -> int:
    return int(min(2000, max(5, (256 << 20) // max(nbytes, 1))))


def _sweep(allreduce_fn, barrier, rank: int, sizes: list[int]) -> dict[int, float]:
    times = {}
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        iters = _iterations(nbytes)
        for _ in range(min(3, iters)):
            allreduce_fn(x)
        barrier()
        start = time.perf_counter()
        for _ in range(iters):
            allreduce_fn(x)
        barrier()
        times[nbytes] = (time.perf_counter() - start) / iters
    return times


def worker(system: str, sizes: list[int]) -> None:
    if system == "allreduce":
        import allreduce as dist

        dist.init_process_group()
        rank, fn, barrier, done = dist.get_rank(), dist.all_reduce, dist.barrier, dist.destroy_process_group
    elif system == "gloo":
        import torch
        import torch.distributed as tdist

        torch.set_num_threads(1)
        tdist.init_process_group("gloo")
        rank = tdist.get_rank()
        fn = lambda x: tdist.all_reduce(torch.from_numpy(x))  # noqa: E731 - shares x's memory
        barrier, done = tdist.barrier, tdist.destroy_process_group
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, barrier, done = comm.Get_rank(), comm.Barrier, lambda: None
        fn = lambda x: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)  # noqa: E731
    times = _sweep(fn, barrier, rank, sizes)
    done()
    if rank == 0:
        print("RESULT " + json.dumps({str(k): v for k, v in times.items()}), flush=True)


# ---- the driver ---------------------------------------------------------------------------------

def missing(system: str) -> str | None:
    """Why ``system`` cannot run here, or ``None``."""
    probe = {"allreduce": "allreduce", "gloo": "torch.distributed", "mpi": "mpi4py"}[system]
    code = subprocess.run([sys.executable, "-c", f"import {probe}"], capture_output=True).returncode
    if code:
        return f"python cannot import {probe}"
    if system == "mpi" and not shutil.which("mpirun"):
        return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    return None


def run_system(system: str, n: int, sizes: list[int], timeout: float) -> dict[int, float]:
    args = [sys.executable, HERE, "--worker", system, "--sizes", ",".join(map(str, sizes))]
    if system == "mpi":
        cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none"] + (
            ["--allow-run-as-root"] if os.geteuid() == 0 else []) + args
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    else:
        cmd = [sys.executable, "-m", "allreduce", "run", "-n", str(n), "--no-tag-output", "--"] + args
        env = dict(os.environ)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}
    raise RuntimeError(f"{system} -n {n} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def memory_bandwidth() -> float:
    """GB/s of np.copyto on 256 MiB (bytes read + written counted once, like a memcpy rate)."""
    a, b = np.ones(64 << 20, np.float32), np.empty(64 << 20, np.float32)
    np.copyto(b, a)
    best = min(_timed(lambda: np.copyto(b, a)) for _ in range(5))
    return a.nbytes / best / 1e9


def loopback_tcp() -> float:
    """GB/s of one TCP stream over loopback between two processes (1 GiB, 4 MiB writes)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    total, chunk = 1 << 30, 4 << 20
    pid = os.fork()
    if pid == 0:
        with socket.create_connection(("127.0.0.1", port)) as s:
            block = bytes(chunk)
            for _ in range(total // chunk):
                s.sendall(block)
            s.recv(1)
        os._exit(0)
    conn, _ = server.accept()
    buf = memoryview(bytearray(chunk))
    start, got = time.perf_counter(), 0
    while got < total:
        got += conn.recv_into(buf)
    elapsed = time.perf_counter() - start
    conn.sendall(b"x")
    os.waitpid(pid, 0)
    conn.close()
    server.close()
    return total / elapsed / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def table(n: int, sizes: list[int], results: dict[str, dict[int, float]]) -> list[str]:
    peers = [s for s in SYSTEMS if s != "allreduce" and s in results]
    factor = 2 * (n - 1) / n
    head = f"| size | " + " | ".join(f"{s} time | {s} busbw" for s in results) + " | " + " | ".join(
        f"allreduce/{p}" for p in peers) + " |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for size in sizes:
        cells = []
        for system in results:
            t = results[system][size]
            cells += [f"{t * 1e6:.1f} us", f"{size / t * factor / 1e9:.2f} GB/s"]
        ratios = [f"{results[p][size] / results['allreduce'][size]:.2f}x" if "allreduce" in results else "-" for p in peers]
        lines.append(f"| {fmt_size(size)} | " + " | ".join(cells + ratios) + " |")
    return lines


def plot(path: str, per_n: dict[int, dict[str, dict[int, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(per_n), figsize=(6 * len(per_n), 4.5), squeeze=False)
    for ax, (n, results) in zip(axes[0], sorted(per_n.items())):
        for system, times in results.items():
            xs = sorted(times)
            ax.plot(xs, [x / times[x] * 2 * (n - 1) / n / 1e9 for x in xs], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"all_reduce float32 sum, {n} ranks")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("-n", "--ranks", default="2,4", help="comma list of world sizes (default 2,4)")
    parser.add_argument("-b", "--min-bytes", default="8")
    parser.add_argument("-e", "--max-bytes", default="256M")
    parser.add_argument("-f", "--factor", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--plot", default="out/compare.png", help="PNG path ('' for none)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, [int(s) for s in args.sizes.split(",")])
        return 0
    sizes = sizes_between(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.factor)
    systems = []
    for system in args.systems.split(","):
        why = missing(system)
        if why:
            print(f"# skipping {system}: {why}")
        else:
            systems.append(system)
    print(f"# {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPUs; memory copy {memory_bandwidth():.1f} GB/s; "
          f"loopback TCP {loopback_tcp():.2f} GB/s (one stream)")
    per_n = {}
    for n in [int(v) for v in args.ranks.split(",")]:
        best: dict[str, dict[int, float]] = {s: {} for s in systems}
        for round_ in range(args.rounds):
            for system in systems:
                for size, t in run_system(system, n, sizes, args.timeout).items():
                    best[system][size] = min(t, best[system].get(size, float("inf")))
                print(f"# {n} ranks, round {round_ + 1}/{args.rounds}: {system} done", file=sys.stderr)
        per_n[n] = best
        print(f"\n## {n} ranks (float32 SUM, best of {args.rounds} rounds)\n")
        print("\n".join(table(n, sizes, best)))
    if args.plot:
        plot(args.plot, per_n)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
