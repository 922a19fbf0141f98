"""allreduce against torch.distributed's Gloo and Open MPI (mpi4py), side by side, in one run.

    python benchmarks/compare.py                       # 2 and 4 ranks, 8 B .. 64 MiB, 3 rounds
    python benchmarks/compare.py -n 2 --sizes 8,64K,1M,16M,64M --rounds 5
    python benchmarks/compare.py --variant cma:ALLREDUCE_SHM_STAGED_MAX=0   # a second allreduce setting
    python benchmarks/compare.py --tcp --sizes 8,64K,1M,16M   # and every system over TCP, in a table of its own
    python benchmarks/compare.py -n 2 --sizes 8,64K --busy 1 --variant python:ALLREDUCE_ENGINE=python
                                                       # beside a busy process, both engines

Every system runs the same float32 SUM all-reduce sweep; the systems take turns round by round (so a
noisy minute hurts all of them alike) and each size keeps the median of its rounds. The table gives
latency in us up to 64 KiB and busbw (nccl-tests' 2(n-1)/n factor) above, rank 0's CPU time per call
for the latency sizes, and the ratio peer/allreduce of times (>1 means allreduce is faster). The header
states the machine's own limits measured in the same run (memory copy bandwidth: np.copyto of 256 MiB;
loopback TCP throughput) and its load average before and after. Systems that are not installed are
skipped with a message. With ``--tcp``, a second table per world size puts everyone on TCP loopback:
allreduce over TCP on its compiled engine (``allreduce-tcp``) and on its Python engine
(``allreduce-tcp-python``), Gloo (always TCP), and Open MPI restricted to its TCP transport
(``mpi-tcp``: ``--mca btl tcp,self --mca pml ob1``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)
SYSTEMS = ("allreduce", "gloo", "mpi")
MPI_TCP = ["--mca", "btl", "tcp,self", "--mca", "pml", "ob1"]  # Open MPI on TCP alone (no shared memory)
# The TCP table's columns: (system, allreduce's environment, mpirun's extra arguments).
TCP_RUNS = {
    "allreduce-tcp": ("allreduce", {"ALLREDUCE_TRANSPORT": "tcp"}, []),
    "allreduce-tcp-python": ("allreduce", {"ALLREDUCE_TRANSPORT": "tcp", "ALLREDUCE_ENGINE": "python"}, []),
    "gloo": ("gloo", {}, []),
    "mpi-tcp": ("mpi", {}, MPI_TCP),
}


# ---- workers: one process per rank, each prints nothing but rank 0's JSON line ------------------

def _iterations(nbytes: int) -> int:
    return int(min(1000, max(5, (64 << 20) // max(nbytes, 1))))


def _sweep(allreduce_fn, barrier, sizes: list[int]) -> dict[int, tuple[float, float]]:
    """Seconds of wall time and of this process's CPU time per call, for each size."""
    times = {}
    for nbytes in sizes:
        x = np.zeros(max(1, nbytes // 4), np.float32)  # zeros: sums stay finite however many calls
        iters = _iterations(nbytes)
        for _ in range(min(3, iters)):
            allreduce_fn(x)
        barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            allreduce_fn(x)
        barrier()
        times[nbytes] = ((time.perf_counter() - start) / iters, (time.process_time() - cpu) / iters)
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
    times = _sweep(fn, barrier, sizes)
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


def run_system(system: str, n: int, sizes: list[int], timeout: float,
               extra_env: dict | None = None, mpi_args: list[str] | None = None) -> dict[int, tuple[float, float]]:
    """``{size: (seconds, cpu seconds) per call}`` of one sweep of ``system`` on ``n`` ranks."""
    args = [sys.executable, HERE, "--worker", system, "--sizes", ",".join(map(str, sizes))]
    if system == "mpi":
        cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none"] + (
            ["--allow-run-as-root"] if os.geteuid() == 0 else []) + (mpi_args or []) + args
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    else:
        cmd = [sys.executable, "-m", "allreduce", "run", "-n", str(n), "--no-tag-output", "--"] + args
        env = dict(os.environ, **(extra_env or {}))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): tuple(v) for k, v in json.loads(line[7:]).items()}
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


LATENCY_MAX = 64 << 10  # sizes up to this are shown as latency (and CPU per call), larger ones as busbw


def table(n: int, sizes: list[int], results: dict[str, dict[int, tuple[float, float]]]) -> list[str]:
    """One markdown table: a column per system, its CPU per call at latency sizes, then the ratios
    peer time / allreduce time for each peer (every system not named ``allreduce...``)."""
    ours = [s for s in results if s.startswith("allreduce")]
    peers = [s for s in results if s not in ours]
    factor = 2 * (n - 1) / n
    head = ["size"] + list(results) + [f"{s} CPU" for s in results] + [
        f"{o}/{p}" for o in ours for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for size in sizes:
        cells = [fmt_size(size)]
        for system in results:
            t = results[system][size][0]
            cells.append(f"{t * 1e6:.1f} us" if size <= LATENCY_MAX else f"{size / t * factor / 1e9:.2f} GB/s")
        cells += [f"{results[s][size][1] * 1e6:.1f} us" if size <= LATENCY_MAX else "" for s in results]
        cells += [_ratio(results[p][size][0] / results[o][size][0]) for o in ours for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ratio(r: float) -> str:
    return f"{r:.2f}x" if r >= 0.1 else f"1/{1 / r:.0f}"


def plot(path: str, per_n: dict[int, dict[str, dict[int, tuple[float, float]]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from allreduce.sim.sweep import curve_style, size_axis

    fig, axes = plt.subplots(1, len(per_n), figsize=(6 * len(per_n) + 1.5, 4.5), squeeze=False)
    for ax, (n, results) in zip(axes[0], sorted(per_n.items())):
        for i, (system, times) in enumerate(results.items()):
            xs = sorted(times)
            ax.plot(xs, [x / times[x][0] * 2 * (n - 1) / n / 1e9 for x in xs], label=system, **curve_style(i))
        size_axis(ax)
        ax.set_yscale("log")  # small sizes are orders of magnitude below large ones
        ax.set_xlabel("message size")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"all_reduce float32 sum, {n} ranks")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def median_of(rounds: list[dict[int, tuple[float, float]]]) -> dict[int, tuple[float, float]]:
    """Per size, the median wall time over rounds and the median CPU time."""
    return {size: (float(np.median([r[size][0] for r in rounds])), float(np.median([r[size][1] for r in rounds])))
            for size in rounds[0]}


def load() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("-n", "--ranks", default="2,4", help="comma list of world sizes (default 2,4)")
    parser.add_argument("--sizes", default="8,1K,8K,64K,256K,1M,4M,16M,64M",
                        help="comma list of message sizes (default 8,1K,8K,64K,256K,1M,4M,16M,64M)")
    parser.add_argument("-b", "--min-bytes", help="instead of --sizes: sweep from this size ...")
    parser.add_argument("-e", "--max-bytes", default="64M", help="... to this one ...")
    parser.add_argument("-f", "--factor", type=int, default=4, help="... multiplying by this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                        help="also run allreduce with these environment variables, as column allreduce-NAME")
    parser.add_argument("--plot", default="out/compare.png", help="PNG path ('' for none)")
    parser.add_argument("--tcp", action="store_true",
                        help="also a table of every system over TCP loopback (allreduce on both engines, "
                             "Gloo, Open MPI's TCP transport)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--busy", type=int, default=0,
                        help="run beside this many busy processes (`while 1: pass` each): a shared machine")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, [int(s) for s in args.sizes.split(",")])
        return 0
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # say so now, not after the sweep
        parser.error("--plot needs matplotlib (pip install matplotlib); --plot '' runs without a plot")
    if args.min_bytes:
        sizes = sizes_between(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.factor)
    else:
        sizes = sorted(parse_bytes(s) for s in args.sizes.split(","))
    runs: dict[str, tuple[str, dict, list]] = {}  # column -> (system, extra environment, mpirun arguments)
    reasons = {system: missing(system) for system in SYSTEMS}
    for system in filter(None, args.systems.split(",")):  # --systems '' leaves only the TCP table
        if reasons[system]:
            print(f"# skipping {system}: {reasons[system]}")
        else:
            runs[system] = (system, {}, [])
    for variant in args.variant:
        name, _, assignments = variant.partition(":")
        runs[f"allreduce-{name}"] = ("allreduce", dict(a.split("=", 1) for a in assignments.split(",") if a), [])
    tables = {"": runs} if runs else {}  # title -> its columns
    if args.tcp:
        tables[" over TCP loopback"] = {column: run for column, run in TCP_RUNS.items() if not reasons[run[0]]}
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, load average {load()} (1/5/15 min); "
          f"memory copy {memory_bandwidth():.1f} GB/s; loopback TCP {loopback_tcp():.2f} GB/s (one stream)")
    print(f"# {sys.executable} {' '.join(sys.argv)}")
    if args.busy:
        print(f"# beside {args.busy} busy process(es), started now and stopped at the end")
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    try:
        return _compare(args, sizes, tables)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _compare(args, sizes: list[int], tables: dict[str, dict[str, tuple[str, dict, list]]]) -> int:
    """Every round of every column of every table, then the tables (and the plot)."""
    per_n = {}
    for n in [int(v) for v in args.ranks.split(",")]:
        for title, columns in tables.items():
            rounds: dict[str, list] = {column: [] for column in columns}
            for round_ in range(args.rounds):
                for column, (system, env, mpi_args) in columns.items():
                    rounds[column].append(run_system(system, n, sizes, args.timeout, env, mpi_args))
                    print(f"# {n} ranks{title}, round {round_ + 1}/{args.rounds}: {column} done (load {load()})",
                          file=sys.stderr)
            results = {column: median_of(r) for column, r in rounds.items()}
            per_n.setdefault(n, results)  # the plot shows the first table
            print(f"\n## {n} ranks{title} (float32 SUM, median of {args.rounds} rounds; load average now {load()})\n")
            print("\n".join(table(n, sizes, results)))
    if args.plot:
        plot(args.plot, per_n)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
