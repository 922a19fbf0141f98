"""How long the simulator takes: every registered algorithm at 16384 ranks, the ring and hierarchical at 65536.

    python benchmarks/sim_speed.py                    # 1 GiB, 16384 ranks on 2048 hosts; 65536 on 8192
    python benchmarks/sim_speed.py --hosts 1 --size 64M -n 1024

The goals: under 10 seconds for each algorithm at 16384 ranks, under 60 for the whole table, under 30
for the lines at 65536 ranks. The table gives the wall time and the process's CPU time (the wall
time on a busy machine is the CPU time stretched by the load), the predicted time and how the
prediction was made (full run, a cell of rotation-invariant ranks, or an extrapolated pipeline).
Algorithms that cannot run across the hosts (the shared-memory lines) are listed as refused.
"""

from __future__ import annotations

import argparse
import time

from allreduce import algorithms
from allreduce.cli.bench import parse_size
from allreduce.planner import costmodel
from allreduce.sim import refusal, simulate

GOAL_S = 10.0  # per algorithm at -n ranks
BIG_GOAL_S = 30.0  # per line at --big-n ranks
BIG = ("ring", "hierarchical")  # the all-reduces timed at --big-n ranks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default="1G", help="bytes of the whole buffer (default 1G)")
    parser.add_argument("-n", type=int, default=16384, help="ranks for every all-reduce (default 16384)")
    parser.add_argument("--hosts", type=int, default=2048, help="hosts of the -n ranks (default 2048)")
    parser.add_argument("--cores", type=int, default=8, help="cores per host (default 8)")
    parser.add_argument("--big-n", type=int, default=65536,
                        help="ranks for the ring and hierarchical lines (default 65536)")
    parser.add_argument("--big-hosts", type=int, default=8192, help="hosts of the --big-n ranks (default 8192)")
    args = parser.parse_args()
    profile = costmodel.load().updated(cores=args.cores)
    cases = [(name, args.n, args.hosts, GOAL_S) for name in algorithms.names("all_reduce")]
    cases += [(name, args.big_n, args.big_hosts, BIG_GOAL_S) for name in BIG]
    print(f"# simulator speed, all_reduce of {args.size} bytes, {args.cores} cores per host; profile: {profile.source}")
    print(f"#{'algorithm':>19}{'ranks':>7}{'hosts':>7}{'wall(s)':>9}{'cpu(s)':>8}{'predicted(ms)':>15}  method")
    slow, table = 0, 0.0
    for name, n, hosts, goal in cases:
        if (why := refusal("all_reduce", name, hosts)) is not None:  # the lines across hosts: not priced
            print(f"{name:>20}{n:>7}{hosts:>7}  refused: {why}")
            continue
        started, cpu = time.perf_counter(), time.process_time()
        result = simulate("all_reduce", name, args.size, n, profile.network(hosts))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        table += wall if n == args.n else 0.0
        slow += wall >= goal
        print(f"{name:>20}{n:>7}{hosts:>7}{wall:>9.2f}{cpu:>8.2f}{result.time * 1e3:>15.2f}  {result.method}"
              + ("  SLOW" if wall >= goal else ""), flush=True)
    print(f"# {slow} of {len(cases)} over their goal; the table at {args.n} ranks took {table:.1f} s")
    return 1 if slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
