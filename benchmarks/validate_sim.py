"""The simulator against measured times: ring, tree and Rabenseifner all-reduce, 64 KiB .. 64 MiB.

    python benchmarks/validate_sim.py                  # one host (loopback/shm) and the netns testbed
    python benchmarks/validate_sim.py --where host     # one host only (no root needed)
    python benchmarks/validate_sim.py --where netns --rate 400mbit --iters 5

Each testbed is first measured with ``allreduce tune`` (so the profile is the testbed's own), then
benchmarked with ``allreduce bench`` (``--rounds`` times, each row keeping its fastest round, so
that a moment of other load on the machine does not count); every row is then predicted by the
simulator from that profile and the table gives both times and the error
``(predicted - measured) / measured``.

- *host*: 2 and 4 ranks on this machine (``--host-ranks``), over the transport the library picks
  (shared memory where available, else loopback TCP; ``ALLREDUCE_TRANSPORT`` forces one), tuned with
  the same transport; the tune's per-step cost and its crowded share (ranks outnumbering cores, as 4
  ranks do on a 2-core machine) are what the small sizes test.
- *netns*: 4 network namespaces on one bridge, each link capped at ``--rate`` both ways by ``tc tbf``
  (``tests/netns.py``), one rank per namespace, so every rank is its own host; tuned between
  namespaces 0 and 1 (``--scope inter``). Needs root; skipped with a message where namespaces fail.
  The rate must be one the machine can forward on all links at once, or the CPU, not the cap, sets
  the pace: on the 2-core development machine four 1 Gbit/s flows reach only 0.38 Gbit/s each, while
  at 400 Mbit/s they reach 87% of the cap, as a single flow does (the TCP/IP headers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the namespace testbed

from allreduce import algorithms  # noqa: E402
from allreduce.planner import costmodel  # noqa: E402
from allreduce.sim import simulate  # noqa: E402
from allreduce.sim.sweep import format_bytes  # noqa: E402

ALGORITHMS = ("ring", "tree", "rabenseifner")
PORT = 29517  # inside the namespaces every port is free


def bench_args(args, algos: list[str]) -> list[str]:
    return ["--algorithm", ",".join(algos), "-b", args.min_bytes, "-e", args.max_bytes, "-f", "4",
            "--iters", str(args.iters), "--warmup", str(args.warmup)]


def tune_host(workdir: str) -> tuple[costmodel.Profile, str]:
    """Tune the transport local ranks use; return (profile, transport)."""
    transport = os.environ.get("ALLREDUCE_TRANSPORT") or _local_transport()
    profile_path = os.path.join(workdir, "host.json")
    _run([sys.executable, "-m", "allreduce", "tune", "--transport", transport, "--output", profile_path])
    return costmodel.load(profile_path), transport


def on_host(args, ranks: int, algos: list[str], transport: str, workdir: str) -> list[dict]:
    """Bench ``ranks`` local ranks ``--rounds`` times; return the rows, each its fastest round."""
    out = os.path.join(workdir, f"host-bench-{ranks}.json")
    env = {**os.environ, "ALLREDUCE_TRANSPORT": transport}
    rounds = []
    for _ in range(args.rounds):
        _run([sys.executable, "-m", "allreduce", "bench", "-n", str(ranks), *bench_args(args, algos), "--json", out],
             env=env)
        rounds.append(_rows(out))
    return fastest(rounds)


def in_namespaces(args, algos: list[str], workdir: str) -> tuple[list[dict], costmodel.Profile] | None:
    """Tune between two namespaces and bench one rank per namespace; ``None`` where netns fails."""
    import netns

    if not netns.available():
        print("# netns: network namespaces are not available here (root, ip and tc needed); skipped")
        return None
    profile_path = os.path.join(workdir, "netns.json")
    with netns.Testbed(args.ranks, rate=args.rate, burst=args.burst) as bed:
        _job(bed, 2, ["tune", "--job", "--scope", "inter", "--transport", "tcp", "--output", profile_path])
        out = os.path.join(workdir, "netns-bench.json")
        rounds = []
        for _ in range(args.rounds):
            _job(bed, args.ranks, ["bench", *bench_args(args, algos), "--json", out])
            rounds.append(_rows(out))
    return fastest(rounds), costmodel.load(profile_path)


def fastest(rounds: list[list[dict]]) -> list[dict]:
    """The rows of the first round, each with the smallest time any round measured for it."""
    best = {}
    for rows in rounds:
        for row in rows:
            key = (row["algorithm"], row["size"])
            if key not in best or row["time_us"] < best[key]["time_us"]:
                best[key] = row
    return [best[row["algorithm"], row["size"]] for row in rounds[0]]


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)["rows"]


def _job(bed, ranks: int, argv: list[str]) -> None:
    """Run ``python -m allreduce ARGV`` as ranks 0..ranks-1, rank i in namespace i."""
    procs = []
    for rank in range(ranks):
        env = {"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": bed.addresses[0], "MASTER_PORT": str(PORT), "ALLREDUCE_TRANSPORT": "tcp"}
        procs.append(bed.popen(rank, [sys.executable, "-m", "allreduce", *argv], env=env, stdout=subprocess.DEVNULL))
    for proc in procs:
        if proc.wait(timeout=1800):
            raise RuntimeError(f"{' '.join(argv[:1])} in the namespaces failed with status {proc.returncode}")


def compare(rows: list[dict], profile: costmodel.Profile, ranks: int, hosts: int, transport: str) -> list[dict]:
    """Each bench row with the simulator's prediction and the error."""
    network = profile.network(hosts, "float32", transport)
    out = []
    for row in rows:
        predicted = simulate("all_reduce", row["algorithm"], row["size"], ranks, network).time * 1e6
        out.append({"algorithm": row["algorithm"], "size": row["size"], "measured_us": row["time_us"],
                    "predicted_us": predicted, "error": (predicted - row["time_us"]) / row["time_us"]})
    return out


def report(title: str, table: list[dict], profile: costmodel.Profile, transport: str, scope: str) -> None:
    link = profile.link(transport, scope)
    print(f"# {title}: {transport} {scope}-host alpha {link.alpha * 1e6:.1f} us, beta {link.beta * 1e9:.3f} ns/B "
          f"({1 / link.beta / 1e9:.3f} GB/s), duplex {link.duplex:.2f}, step {link.step * 1e6:.1f} us, crowded "
          f"{link.crowded:.2f}; gamma {profile.gamma_for('float32') * 1e9:.3f} ns/B")
    print(f"| {'algorithm':<13}| {'size':>9} | {'measured (us)':>13} | {'predicted (us)':>14} | {'error':>7} |")
    print(f"|{'-' * 14}|{'-' * 11}|{'-' * 15}|{'-' * 16}|{'-' * 9}|")
    for r in table:
        print(f"| {r['algorithm']:<13}| {format_bytes(r['size']):>9} | {r['measured_us']:>13.0f} "
              f"| {r['predicted_us']:>14.0f} "
              f"| {r['error'] * 100:>+6.1f}% |")
    worst = max(table, key=lambda r: abs(r["error"]))
    within = sum(abs(r["error"]) <= 0.2 for r in table)
    print(f"# {within} of {len(table)} within 20%; worst {worst['error'] * 100:+.1f}% "
          f"({worst['algorithm']}, {format_bytes(worst['size'])})\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--where", choices=("both", "host", "netns"), default="both")
    parser.add_argument("--ranks", type=int, default=4, help="ranks (namespaces) of the testbed (default 4)")
    parser.add_argument("--host-ranks", type=lambda t: [int(n) for n in t.split(",")], default=[2, 4],
                        help="world sizes on one host, comma list (default 2,4)")
    parser.add_argument("--rate", default="400mbit", help="tbf rate of every namespace link (default 400mbit)")
    parser.add_argument("--burst", default="8kb", help="tbf bucket size (default 8kb: a bucket lets that much "
                        "pass at full speed, which the model does not know)")
    parser.add_argument("-b", "--min-bytes", default="64K")
    parser.add_argument("-e", "--max-bytes", default="64M")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="bench runs; each row keeps its fastest (default 2)")
    parser.add_argument("--json", metavar="PATH", help="also write every table to PATH")
    args = parser.parse_args(argv)
    algos = [a for a in ALGORITHMS if a in algorithms.names("all_reduce")]
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": os.uname().nodename, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as workdir:
        if args.where in ("both", "host"):
            profile, transport = tune_host(workdir)
            for ranks in args.host_ranks:
                rows = on_host(args, ranks, algos, transport, workdir)
                results[f"host{ranks}"] = compare(rows, profile, ranks, 1, transport)
                report(f"one host, {ranks} ranks ({os.cpu_count()} cpus)", results[f"host{ranks}"], profile, transport,
                       "intra")
        if args.where in ("both", "netns"):
            measured = in_namespaces(args, algos, workdir)
            if measured is not None:
                rows, profile = measured
                results["netns"] = compare(rows, profile, args.ranks, args.ranks, "tcp")
                report(f"{args.ranks} namespaces, links capped at {args.rate}", results["netns"], profile, "tcp",
                       "inter")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def _local_transport() -> str:
    from allreduce.transport import shm

    return "shm" if shm.available() else "tcp"


def _run(cmd: list[str], env: dict | None = None) -> None:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[2:4])} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")


if __name__ == "__main__":
    raise SystemExit(main())
