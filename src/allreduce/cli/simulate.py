"""``allreduce simulate``: predict a collective's time on any number of ranks, without starting any.

The network comes from the cost profile (``--profile``, else the one ``allreduce tune`` stored, else
the built-in defaults); ``--alpha``, ``--beta``, ``--duplex``, ``--step`` replace every link's figures, the
``--inter-*`` flags the inter-host link's alone, and ``--cores`` the cores per host. Quantities take units:
``25us``, ``10Gbit/s``, ``1.25GB/s`` (a bandwidth becomes beta = 1 / bandwidth), or plain seconds and seconds per byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import time

from .. import algorithms, dtypes, planner
from ..model.network import Network
from ..planner import costmodel
from ..settings import Settings
from ..sim import refusal, simulate
from ..sim.sweep import crossovers, fastest, format_bytes, plot, sweep
from ..trace import Trace
from ..transport.shm.options import ShmOptions

from . import checks, launcher
from .measuring import parse_size, sizes as sweep_sizes
from .progress import Progress

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_seconds(text: str) -> float:
    """Seconds from ``"2.5e-5"``, ``"25us"``, ``"0.1ms"``, ``"1s"``; ``ValueError`` otherwise."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|ms|us|ns)?\s*", text)
    if not match:
        raise ValueError(f"not a time: {text!r}; use e.g. 25us, 0.1ms or 2.5e-5")
    return float(match[1]) * _TIME_UNITS[match[2] or "s"]


def parse_per_byte(text: str) -> float:
    """Seconds per byte from ``"1e-9"`` or a bandwidth: ``"10Gbit/s"``, ``"1.25GB/s"``, ``"800MB/s"``."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(?:([kKMGT]?)(bit|B)/s)?\s*", text)
    if not match:
        raise ValueError(f"not seconds per byte or a bandwidth: {text!r}; use e.g. 1e-9, 10Gbit/s or 1.25GB/s")
    value = float(match[1])
    if not match[3]:
        return value
    scale = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[match[2]]
    bytes_per_second = value * scale / (8 if match[3] == "bit" else 1)
    if bytes_per_second <= 0:
        raise ValueError(f"bandwidth must be positive, got {text!r}")
    return 1 / bytes_per_second


def profile_named(path: str | None) -> costmodel.Profile:
    """The cost profile at ``path`` (``--profile``), else ``ALLREDUCE_PROFILE``'s, else the user's cache's."""
    settings = Settings.from_env()
    return costmodel.load(path or settings.profile, settings.cache_home)


def network_from_args(args: argparse.Namespace, transport: str = "tcp") -> Network:
    """The profile's network for ``--hosts``, ``--dtype`` and ``transport``, with the flags' replacements."""
    network = profile_named(args.profile).network(args.hosts, args.dtype, transport)
    uniform = {k: v for k, v in (("alpha", args.alpha), ("beta", args.beta), ("duplex", args.duplex),
                                 ("step", args.step)) if v is not None}
    inter = {k: v for k, v in (("alpha", args.inter_alpha), ("beta", args.inter_beta),
                                ("duplex", args.inter_duplex)) if v is not None}
    return dataclasses.replace(
        network,
        intra=dataclasses.replace(network.intra, **uniform),
        inter=dataclasses.replace(network.inter, **uniform, **inter),
        **({"gamma": args.gamma} if args.gamma is not None else {}),
        **({"cores": args.cores} if args.cores is not None else {}),
    )


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand."""
    parser = subparsers.add_parser(
        "simulate",
        help="predict a collective's time on a modelled network of any size",
        description="Run the algorithms' own schedules over a modelled network (per-rank full-duplex links, "
        "contention, hosts sharing a NIC, reduction cost) and print the predicted time and bus bandwidth.",
        epilog="examples: allreduce simulate --algo ring --size 1GiB -n 4096 --hosts 512; "
        "allreduce simulate -n 64 --sweep --plot sweep.png; "
        "allreduce simulate --algo tree --size 1M -n 8 --alpha 20us --beta 10Gbit/s --timeline tree.json",
    )
    parser.add_argument("--algo", default="all", help="algorithm, comma list, or all (default all)")
    parser.add_argument("--collective", default="all_reduce", choices=algorithms.COLLECTIVES,
                        help="collective (default all_reduce)")
    parser.add_argument("--size", type=size_arg, default="64M", help="bytes of the whole buffer (default 64M)")
    parser.add_argument("-n", "--nranks", type=launcher.int_at_least(1), default=16, help="world size (default 16)")
    parser.add_argument("--hosts", type=launcher.int_at_least(1), default=1,
                        help="hosts, equal contiguous blocks of ranks (default 1)")
    parser.add_argument("--dtype", default="float32", type=checks.dtype_name([str(d) for d in dtypes.SUPPORTED]),
                        help="element type (default float32)")
    parser.add_argument("--profile", metavar="FILE", help="cost profile (default: the one allreduce tune stored)")
    parser.add_argument("--alpha", type=_arg(parse_seconds), help="seconds per message on every link (e.g. 25us)")
    parser.add_argument("--beta", type=_arg(parse_per_byte), help="seconds per byte or bandwidth of every link")
    parser.add_argument("--duplex", type=float, help="1 = full duplex .. 2 = half duplex, every link")
    parser.add_argument("--step", type=_arg(parse_seconds),
                        help="seconds per schedule step, however many messages it has, on every link (e.g. 100us)")
    parser.add_argument("--inter-alpha", type=_arg(parse_seconds), help="alpha of the inter-host link only")
    parser.add_argument("--inter-beta", type=_arg(parse_per_byte), help="beta (or bandwidth) of a host's NIC only")
    parser.add_argument("--inter-duplex", type=float, help="duplex of the inter-host link only")
    parser.add_argument("--gamma", type=_arg(parse_per_byte), help="seconds per byte reduced (or a reduce rate)")
    parser.add_argument("--cores", type=launcher.int_at_least(0),
                        help="cores per host; more ranks than cores slow every rank's own work (default: the "
                        "profile's, this machine's without one; 0: never fewer than the ranks)")
    parser.add_argument("--sweep", action="store_true", help="a table across sizes (--min-bytes .. --size)")
    parser.add_argument("-b", "--min-bytes", type=size_arg, default="8", help="first size of --sweep (default 8)")
    parser.add_argument("-f", "--factor", type=launcher.int_at_least(2), default=4,
                        help="size ratio of --sweep (default 4)")
    parser.add_argument("--plot", metavar="PNG", type=checks.plot_file,
                        help="with --sweep: plot time vs size (needs matplotlib)")
    parser.add_argument("--timeline", metavar="JSON", help="write a Chrome trace of the first --trace-ranks ranks")
    parser.add_argument("--trace-ranks", type=launcher.int_at_least(1), default=16, help="ranks traced (default 16)")
    parser.set_defaults(main=main, error=parser.error)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run the ``simulate`` subcommand."""
    try:
        names = (list(algorithms.names(args.collective)) if args.algo == "all"
                 else [a.strip() for a in args.algo.split(",")])
        for name in names:
            algorithms.get(args.collective, name)
        network = network_from_args(args)
        network.ranks_per_host(args.nranks)
        refused = {name: why for name in names if (why := refusal(args.collective, name, args.hosts)) is not None}
        if len(refused) == len(names):
            raise ValueError("; ".join(refused.values()))
        names = [name for name in names if name not in refused]
        networks = {name: network_from_args(args, transport) for name in names
                    if (transport := costmodel.transport_for(args.collective, name, args.hosts, "tcp")) != "tcp"}
        limits = line_limits()
    except ValueError as exc:
        args.error(str(exc))
    if args.timeline and (args.sweep or len(names) != 1):
        args.error("--timeline traces one run: give one --algo and no --sweep")
    if args.plot and not args.sweep:
        args.error("--plot draws a --sweep")
    itemsize = itemsize_of(args.dtype)
    print(f"# {args.collective} on {args.nranks} ranks, {args.hosts} host(s), {args.dtype}; "
          f"intra alpha {network.intra.alpha * 1e6:.1f} us beta {network.intra.beta * 1e9:.3f} ns/B "
          f"duplex {network.intra.duplex:.2f} step {network.intra.step * 1e6:.1f} us; "
          f"inter alpha {network.inter.alpha * 1e6:.1f} us "
          f"beta {network.inter.beta * 1e9:.3f} ns/B; gamma {network.gamma * 1e9:.3f} ns/B; "
          f"{network.cores or 'unlimited'} cores per host (local work x{network.stretch(args.nranks):g})")
    for name, why in refused.items():
        print(f"# {name} refused: {why}")
    if args.sweep:
        return _sweep(args, names, network, itemsize, networks)
    trace = Trace(source="allreduce simulate", collective=args.collective, algorithm=names[0],
                  size=args.nranks, nbytes=args.size) if args.timeline else None
    print(f"#{'algorithm':>19}{'size(B)':>14}{'time(us)':>14}{'busbw(GB/s)':>13}{'steps':>8}  method   wall(s)")
    for name in names:
        started = time.perf_counter()
        r = simulate(args.collective, name, args.size, args.nranks, networks.get(name, network), itemsize=itemsize,
                     trace=trace, trace_ranks=args.trace_ranks, **planner.options(name, itemsize, limits))
        print(f"{name:>20}{r.nbytes:>14}{r.time * 1e6:>14.1f}{r.busbw:>13.3f}{r.steps:>8}  "
              f"{r.method:<8}{time.perf_counter() - started:>7.2f}")
    if trace is not None:
        trace.write(args.timeline)
        print(f"# timeline written to {args.timeline}")
    return 0


def _sweep(args: argparse.Namespace, names: list[str], network: Network, itemsize: int,
           networks: dict[str, Network]) -> int:
    sizes = sweep_sizes(max(args.min_bytes, itemsize), args.size, args.factor)
    with Progress(len(names) * len(sizes), "allreduce simulate") as progress:
        table = sweep(args.collective, names, sizes, args.nranks, network, itemsize,
                      on_result=lambda _: progress.advance(), networks=networks)
    winners = fastest(table)
    width = max(14, *(len(name) + 6 for name in names))
    print("#" + f"{'size(B)':>13}" + "".join(f"{name + '(us)':>{width}}" for name in names) + "  fastest")
    for i in range(len(sizes)):
        print(f"{table[names[0]][i].nbytes:>14}" + "".join(f"{table[n][i].time * 1e6:>{width}.1f}" for n in names)
              + f"  {winners[i]}")
    for cross in crossovers(table):
        print(f"# crossover: {cross.after} overtakes {cross.before} at about {format_bytes(cross.nbytes)}")
    if args.plot:
        try:
            plot(table, args.plot, f"{args.collective}, {args.nranks} ranks, {args.hosts} host(s) (predicted)")
        except ImportError:
            args.error("--plot needs matplotlib: pip install matplotlib")
        print(f"# plot written to {args.plot}")
    return 0


def line_limits() -> planner.LineLimits:
    """What the shared-memory lines take under ``ALLREDUCE_SHM_*`` (the defaults where unset)."""
    options = ShmOptions.from_env()
    return planner.LineLimits(options.line_max, options.chunked_max, options.line_capacity)


def itemsize_of(name: str) -> int:
    """Bytes per element of the supported dtype called ``name`` (bfloat16 included)."""
    return next(d.itemsize for d in dtypes.SUPPORTED if str(d) == name)


def size_arg(text: str) -> int:
    """argparse type for sizes such as ``64MiB`` (see :func:`allreduce.cli.measuring.parse_size`)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _arg(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert
