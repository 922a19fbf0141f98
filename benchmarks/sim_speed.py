"""How long the simulator takes: every registered algorithm at 1024 ranks, the ring at 4096.

    python benchmarks/sim_speed.py                    # 1 GiB, 1024 ranks on 128 hosts; ring on 4096/512
    python benchmarks/sim_speed.py --hosts 1 --size 64M

The goal is under 10 seconds for each line (the simulator should answer while one waits); the table
gives the wall time, the predicted time and how the prediction was made (full run, a cell of
rotation-invariant ranks, or an extrapolated pipeline).
"""

from __future__ import annotations

import argparse
import time

from allreduce import algorithms
from allreduce.cli.bench import parse_size
from allreduce.planner import costmodel
from allreduce.sim import simulate

GOAL_S = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default="1G", help="bytes of the whole buffer (default 1G)")
    parser.add_argument("-n", type=int, default=1024, help="ranks for every algorithm (default 1024)")
    parser.add_argument("--hosts", type=int, default=128, help="hosts of the -n ranks (default 128)")
    parser.add_argument("--ring-n", type=int, default=4096, help="ranks for the ring line (default 4096)")
    parser.add_argument("--ring-hosts", type=int, default=512, help="hosts of the ring line (default 512)")
    args = parser.parse_args()
    profile = costmodel.load()
    cases = [(c, name, args.n, args.hosts) for c in algorithms.COLLECTIVES for name in algorithms.names(c)]
    cases.append(("all_reduce", "ring", args.ring_n, args.ring_hosts))
    print(f"# simulator speed, {args.size} bytes; profile: {profile.source}")
    print(f"#{'collective':>15}{'algorithm':>20}{'ranks':>7}{'hosts':>7}{'wall(s)':>9}{'predicted(ms)':>15}  method")
    slow = 0
    for collective, name, n, hosts in cases:
        started = time.perf_counter()
        result = simulate(collective, name, args.size, n, profile.network(hosts))
        wall = time.perf_counter() - started
        slow += wall >= GOAL_S
        print(f"{collective:>16}{name:>20}{n:>7}{hosts:>7}{wall:>9.2f}{result.time * 1e3:>15.2f}  {result.method}"
              + ("  SLOW" if wall >= GOAL_S else ""), flush=True)
    print(f"# {slow} of {len(cases)} over {GOAL_S:g} s")
    return 1 if slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
