"""``allreduce plan``: every algorithm's predicted time for one collective, and the one "auto" picks.

The table is the planner's own reasoning (:func:`allreduce.planner.costmodel.predict` on the cost
profile), so a surprising choice can be traced to the figures behind it; ``--simulate`` adds the
simulator's message-by-message prediction for comparison (and for algorithms without a formula).
"""

from __future__ import annotations

import argparse

import numpy as np

from .. import algorithms, collectives, dtypes, planner
from ..planner import costmodel
from ..settings import Settings
from ..sim import refusal, simulate
from ..sim.sweep import format_bytes

from . import launcher
from .simulate import itemsize_of, line_limits, profile_named, size_arg
from .tune import describe


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``plan`` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="print each algorithm's predicted time and the one auto picks",
        description="Predict every registered algorithm of a collective from the cost profile and show the "
        "choice algorithm='auto' makes for that size, world size and number of hosts.",
        epilog="example: allreduce plan --size 64MiB -n 16 --hosts 4",
    )
    parser.add_argument("--size", type=size_arg, default="64M", help="bytes of the whole buffer (default 64M)")
    parser.add_argument("-n", "--nranks", type=launcher.int_at_least(1), default=2, help="world size (default 2)")
    parser.add_argument("--hosts", type=launcher.int_at_least(1), default=1, help="hosts the ranks span (default 1)")
    parser.add_argument("--collective", default="all_reduce", choices=algorithms.COLLECTIVES,
                        help="collective (default all_reduce)")
    parser.add_argument("--dtype", default="float32", choices=[str(d) for d in dtypes.SUPPORTED],
                        help="element type (default float32)")
    parser.add_argument("--profile", metavar="FILE", help="cost profile (default: the one allreduce tune stored)")
    parser.add_argument("--cores", type=launcher.int_at_least(0), help="cores per host (default: the profile's)")
    parser.add_argument("--simulate", action="store_true", help="add the simulator's prediction per algorithm")
    parser.add_argument("--deterministic", action="store_true",
                        help="choose as deterministic mode does (ALLREDUCE_DETERMINISTIC=1): only algorithms that "
                        "reduce in rank order")
    parser.set_defaults(main=main, error=parser.error)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run the ``plan`` subcommand."""
    try:
        profile = profile_named(args.profile)
        if args.cores is not None:
            profile = profile.updated(cores=args.cores)
        network = profile.network(args.hosts, args.dtype)
        network.ranks_per_host(args.nranks)
        limits = line_limits() if args.hosts == 1 else None
    except ValueError as exc:
        args.error(str(exc))
    itemsize = itemsize_of(args.dtype)
    n, coll = args.nranks, args.collective
    print(f"# {coll} of {format_bytes(args.size)} ({args.dtype}) on {n} ranks, {args.hosts} host(s) "
          f"x {n // args.hosts} rank(s); profile: {profile.source}")
    for line in describe(profile):
        print(line)
    header = f"#{'algorithm':>19}{'predicted(us)':>15}{'busbw(GB/s)':>13}"
    print(header + (f"{'simulated(us)':>15}" if args.simulate else ""))
    factor = collectives.get(coll).bus_factor(n)
    for name in algorithms.names(coll):
        on = profile.network(args.hosts, args.dtype, costmodel.transport_for(coll, name, args.hosts, "tcp"))
        seconds = costmodel.predict(coll, name, args.size, n, on, itemsize)
        cells = (f"{seconds * 1e6:>15.1f}{_busbw(args.size, seconds, factor):>13.3f}" if seconds is not None
                 else f"{'no formula':>15}{'-':>13}")
        if args.simulate:
            options = planner.options(name, itemsize, limits)
            cells += (f"{'refused':>15}" if refusal(coll, name, args.hosts) is not None else
                      f"{simulate(coll, name, args.size, n, on, itemsize=itemsize, **options).time * 1e6:>15.1f}")
        print(f"{name:>20}{cells}")
    settings = Settings.from_env()
    ordered = (args.deterministic or settings.deterministic == "1") and collectives.get(coll).reduces and n > 2
    candidates = algorithms.in_rank_order(coll, n) if ordered else algorithms.names(coll)
    forced = settings.algorithm
    note = f" (but ALLREDUCE_ALGO={forced} overrides it)" if forced != "auto" and forced in candidates else ""
    mode = " in deterministic mode, where only algorithms that reduce in rank order run" if ordered else ""
    per_rank = collectives.get(coll).count_for(args.size, n, itemsize) * itemsize
    lines = planner.on_lines(coll, per_rank, itemsize, limits)
    if lines in candidates:  # the rule, not a price: what the group's lines take
        how = ("in one round" if lines == "lines" else
               f"in chunks of {format_bytes(limits.capacity)}, two rounds each")
        on = profile.network(1, args.dtype, costmodel.LINES)
        print(f"# auto runs: {costmodel.explain(coll, args.size, n, on, itemsize, (lines,))}, as the shared-memory "
              f"lines take this call {how} on one host{mode}{note}")
    elif coll == "all_reduce" and 1 < args.hosts < n and not ordered:  # what the group runs: inside, across, inside
        per_host, cross = n // args.hosts, algorithms.get(coll, "hierarchical").options["cross"]
        print(f"# auto runs: hierarchical (each host first reduces its {per_host} ranks' data, a {cross} all-reduce "
              f"then runs across the {args.hosts} hosts, and each host shares the result){note}")
    else:
        anywhere = algorithms.anywhere(coll, candidates)
        print(f"# auto runs: {costmodel.explain(coll, args.size, n, network, itemsize, anywhere)}{mode}{note}")
    return 0



def _busbw(nbytes: int, seconds: float, factor: float) -> float:
    return nbytes / seconds / 1e9 * factor if seconds > 0 else np.inf
