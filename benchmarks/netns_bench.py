"""All-reduce across network namespaces joined by rate-capped links, against the links' rate.

    python benchmarks/netns_bench.py                                # 2 hosts x 2 ranks, 200 Mbit/s links
    python benchmarks/netns_bench.py --hosts 4 --per-host 1 --rounds 2
    make netns-bench

Each namespace is a host with its own ``allreduce run --nnodes H --node-rank R`` (ranks share memory
inside a host and use TCP across), and every host's link is capped both ways by ``tc tbf``
(tests/support/netns.py). The group picks its algorithm (hierarchical, for several ranks per host).

The table compares each size's time with what the link allows. An all-reduce of S bytes among H
hosts must carry at least ``S * 2(H-1)/H`` bytes over each host's link in each direction, whatever
the algorithm, so ``link use = S * 2(H-1)/H / time / rate``: 100% is the link's line rate. The
ceiling below that is TCP's own: a single flow through the same link (``tcp`` row) carries payload
at about 95% of the rate, the rest being Ethernet, IP and TCP headers. Needs root, ``ip`` and
``tc``. Each row is the median over ``--rounds`` runs (each run's time is itself the median of its
iterations, slowest rank).

The rate must be one the machine forwards with cores to spare, or the CPU, not the cap, sets the pace
(namespaces, veth pairs and tbf all run on the host's cores, beside the ranks): on a busy 2-core
machine a single flow reaches 94% of a 200 Mbit/s link but only 80% of a 400 Mbit/s one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the namespace testbed

from support import netns  # noqa: E402

from allreduce.sim.sweep import format_bytes  # noqa: E402

PORT = 29541  # inside the namespaces every port is free
DEADLINE_S = 1800
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}  # tc's rate units (bits/s)

# A single TCP flow from host 1 to host 0: its payload goodput through the capped link.
_SINK = textwrap.dedent("""
    import socket, sys, time
    server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
    conn, _ = server.accept()
    buf, total, start = bytearray(1 << 20), 0, None
    while n := conn.recv_into(buf):
        start = start or time.perf_counter()
        total += n
    print(total / (time.perf_counter() - start))
""")
_SOURCE = textwrap.dedent("""
    import socket, sys, time
    for _ in range(200):
        try:
            conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
            break
        except OSError:
            time.sleep(0.05)
    block = bytes(1 << 20)
    for _ in range(int(sys.argv[3]) >> 20):
        conn.sendall(block)
    conn.close()
""")


def bits_per_second(rate: str) -> float:
    """tc's rate (``400mbit``, ``1gbit``) in bits per second."""
    for unit in sorted(_UNITS, key=len, reverse=True):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * _UNITS[unit]
    raise ValueError(f"rate {rate!r} is not in tc's bit units ({', '.join(_UNITS)})")


def bench_round(bed: netns.Testbed, args: argparse.Namespace, out: str) -> list[dict]:
    """One ``allreduce bench`` across the namespaces, one launcher per namespace; rank 0's rows."""
    bench = [sys.executable, "-m", "allreduce", "bench", "-b", args.min_bytes, "-e", args.max_bytes, "-f", "4",
             "--iters", str(args.iters), "--warmup", str(args.warmup), "--algorithm", args.algorithm, "--json", out]
    env = {"ALLREDUCE_HOST_ID": "", "ALLREDUCE_SECRET": os.urandom(16).hex()}
    launchers = [bed.popen(host, [sys.executable, "-m", "allreduce", "run", "-n", str(args.per_host),
                                  "--nnodes", str(args.hosts), "--node-rank", str(host),
                                  "--master-addr", bed.addresses[0], "--master-port", str(PORT), "--", *bench],
                           env=env, stdout=subprocess.DEVNULL)
                 for host in range(args.hosts)]
    for launcher in launchers:
        if launcher.wait(timeout=DEADLINE_S):
            raise RuntimeError(f"allreduce run in a namespace failed with status {launcher.returncode}")
    with open(out) as f:
        return json.load(f)["rows"]


def tcp_goodput(bed: netns.Testbed, nbytes: int) -> float:
    """Bytes per second of payload that one TCP flow carries from host 1 to host 0."""
    sink = bed.popen(0, [sys.executable, "-c", _SINK, str(PORT + 1)], stdout=subprocess.PIPE, text=True)
    bed.run(1, [sys.executable, "-c", _SOURCE, bed.addresses[0], str(PORT + 1), str(nbytes)], timeout=DEADLINE_S)
    return float(sink.communicate(timeout=60)[0])


def table(rounds: list[list[dict]], tcp: list[float], args: argparse.Namespace) -> list[dict]:
    """Each size's median time over the rounds, with its link use."""
    link = bits_per_second(args.rate) / 8  # bytes per second
    share = 2 * (args.hosts - 1) / args.hosts  # bytes on each host's link per byte all-reduced
    rows = []
    for same in zip(*rounds):
        seconds = statistics.median(row["time_us"] for row in same) / 1e6
        size = same[0]["size"]
        rows.append({"size": size, "algorithm": same[0]["ran"] or same[0]["algorithm"], "time_s": seconds,
                     "link_use": size * share / seconds / link,
                     "correct": all(r["correct"] is not False for r in same)})
    rows.append({"size": None, "algorithm": "tcp", "time_s": None, "link_use": statistics.median(tcp) / link,
                 "correct": True})
    return rows


def report(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"# {args.hosts} namespaces x {args.per_host} ranks, each link capped at {args.rate} both ways "
          f"(tbf burst {args.burst}, latency {args.latency}); median of {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"| {'size':>9} | {'algorithm':<13}| {'time (ms)':>10} | {'link use':>8} | check |")
    print(f"|{'-' * 11}|{'-' * 14}|{'-' * 12}|{'-' * 10}|-------|")
    for r in rows:
        size = format_bytes(r["size"]) if r["size"] else "1 flow"
        ms = f"{r['time_s'] * 1e3:.1f}" if r["time_s"] else "-"
        print(f"| {size:>9} | {r['algorithm']:<13}| {ms:>10} | {r['link_use'] * 100:>7.1f}% | "
              f"{'ok' if r['correct'] else 'WRONG':>5} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2, help="namespaces (default 2)")
    parser.add_argument("--per-host", type=int, default=2, help="ranks per namespace (default 2)")
    parser.add_argument("--rate", default="200mbit", help="tbf rate of each link, both ways (default 200mbit)")
    parser.add_argument("--burst", default="64kb", help="tbf bucket (default 64kb)")
    parser.add_argument("--latency", default="100ms", help="tbf queue: the longest a packet waits (default 100ms)")
    parser.add_argument("--algorithm", default="auto", help="all-reduce algorithm (default auto: the group's choice)")
    parser.add_argument("-b", "--min-bytes", default="1M")
    parser.add_argument("-e", "--max-bytes", default="64M")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="bench runs; each row is their median (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the table to PATH")
    args = parser.parse_args(argv)
    if not netns.available():
        print("netns-bench: network namespaces are not available here (root, ip and tc needed)", file=sys.stderr)
        return 1
    rounds, tcp = [], []
    testbed = netns.Testbed(args.hosts, args.rate, args.burst, args.latency)
    with tempfile.TemporaryDirectory() as workdir, testbed as bed:
        for i in range(args.rounds):  # interleaved, so a burst of other load touches both alike
            tcp.append(tcp_goodput(bed, 64 << 20))
            rounds.append(bench_round(bed, args, os.path.join(workdir, f"round{i}.json")))
    rows = table(rounds, tcp, args)
    report(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args), "rows": rows}, f, indent=1)
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
