"""``allreduce tune``: measure this machine's alpha, beta and gamma and store them as the cost profile.

Two ranks (started here, or the two ranks of a job with ``--job``) time collectives whose schedules
are a single known step, through the same API and executor that real collectives use:

- *exchange*: a ring all-gather on two ranks is one step in which both ranks send and receive ``m``
  bytes at once (after copying ``m`` bytes locally), as most steps of most algorithms are; its time
  at sizes up to 4 KiB is alpha;
- *ping-pong*: a two-rank broadcast from rank 0 then one from rank 1 is a round trip of one message each
  way on the collectives' transport; the slope of half of it over sizes from 256 KiB to 16 MiB is beta;
- *duplex*: how much slower the large exchanges are than one direction alone, from 1 (independent
  directions) to 2 (one shared pipe, as loopback is when the CPU copies every byte);
- *gamma* per dtype: the SUM kernel (a numpy ufunc with ``out=``) on 16 MiB, on rank 0; *copy*:
  ``np.copyto`` likewise.

Then :data:`STEP_RANKS` ranks time an 8-byte all-reduce with each of :data:`STEP_PROBES` (many
steps of one message, few steps, few steps of many messages). The two-rank alpha is one step of one
message; these times split it into a fixed cost per step (``step``) and one per message (``alpha``),
and, where the ranks outnumber the cores, tell how much of the ranks / cores stretch those fixed costs
take (``crowded``: below 1 where a waiting rank's core serves its peers, above 1 where every step
also waits for the scheduler); see :func:`fit_step`.

Each size is timed over many iterations and summarized by the median iteration, which a busy machine
disturbs least, and the fastest of ``--rounds`` such medians is kept; the local costs, which involve
no other rank, are the fastest call. The result updates the profile file (``ALLREDUCE_PROFILE`` or
``~/.cache/allreduce/profile.json``, or ``--output``): the link of each transport measured (TCP, and
shared memory where the machine has it; one pair of ranks for each, with ``ALLREDUCE_TRANSPORT`` set)
in the given scope (``intra`` for ranks of one host, ``inter`` when the two ranks are on different
hosts) and the dtypes' gamma; the rest of an existing file is kept. Three rounds take about ten
seconds per transport over loopback or shared memory, half a minute over a 400 Mbit/s link.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time

import numpy as np

import allreduce as dist
from .. import dtypes
from ..model.network import Link, Network
from ..ops import ReduceOp, kernel
from ..planner import costmodel
from ..settings import Settings
from ..transport import shm
from . import launcher

EXCHANGE_SIZES = (8, 64, 512, 4 << 10, 1 << 20, 4 << 20, 16 << 20)
PING_SIZES = (256 << 10, 1 << 20, 4 << 20, 16 << 20)
SMALL = 4 << 10  # exchanges up to this size give alpha
LARGE = 256 << 10  # sizes from this give beta and duplex
LOCAL_BYTES = 16 << 20  # buffer for gamma and copy
STEP_RANKS = 4  # ranks of the per-step measurement
STEP_PROBES = ("ring", "recursive_doubling", "direct")  # all-reduces of different step counts
PROBE_BYTES = 8


def fit_link(ping_sizes, ping, exchange_sizes, exchange, copy: float) -> Link:
    """The :class:`Link` behind the timings (see the module docstring); ``copy`` is seconds per byte
    of the exchange's local copy.

    Args:
        ping_sizes, ping: one-way seconds per size (half a round trip).
        exchange_sizes, exchange: seconds of a two-way exchange per size.

    Raises:
        ValueError: fewer than two ping sizes from :data:`LARGE`, or no exchange size up to
            :data:`SMALL` or from :data:`LARGE`.
    """
    ping_sizes, ping = np.asarray(ping_sizes, float), np.asarray(ping, float)
    exchange_sizes, exchange = np.asarray(exchange_sizes, float), np.asarray(exchange, float)
    large, small, big = ping_sizes >= LARGE, exchange_sizes <= SMALL, exchange_sizes >= LARGE
    if large.sum() < 2 or not small.any() or not big.any():
        raise ValueError(f"need two one-way sizes and one exchange size from {LARGE} bytes and one exchange "
                         f"size up to {SMALL} bytes to fit a link")
    beta = max(0.0, float(np.polyfit(ping_sizes[large], ping[large], 1)[0]))
    alpha = max(0.0, float(np.median(exchange[small] - (copy + beta) * exchange_sizes[small])))
    duplex = 1.0
    if beta > 0:
        ratio = (exchange[big] - alpha - copy * exchange_sizes[big]) / (beta * exchange_sizes[big])
        duplex = float(np.clip(np.median(ratio), 1.0, 2.0))
    return Link(alpha, beta, duplex)


def fit_step(link: Link, seconds: dict[str, float], size: int, cores: int) -> Link:
    """``link`` with its per-step cost, and its ``crowded`` share where ``size`` ranks outnumber
    ``cores``, fitted to ``seconds``: the measured time of a :data:`PROBE_BYTES` all-reduce per
    algorithm on ``size`` ranks of one host.

    ``link.alpha`` is what one step of one message costs (the two-rank exchange); the fit splits it
    into a per-step part and a per-message part, which algorithms that send several messages per
    step tell apart. Least squares over ``t = slow c (steps s + messages (alpha - s))``, linear in
    ``c s`` and ``c``.
    """
    whole = link.alpha + link.step
    bare = dataclasses.replace(link, alpha=1.0, beta=0.0, step=0.0, crowded=1.0)
    unit = Network(bare, bare, 0.0, 0.0, 1, 0)
    slow = Network(bare, bare, cores=cores).stretch(size)
    rows, measured = [], []
    for name, t in seconds.items():
        messages = costmodel.predict("all_reduce", name, PROBE_BYTES, size, unit, 1)  # alpha counted by the formula
        steps = costmodel.step_count("all_reduce", name, size, PROBE_BYTES)
        rows.append([slow * (steps - messages), slow * messages * whole])
        measured.append(t)
    (cs, c), *_ = np.linalg.lstsq(np.array(rows), np.array(measured), rcond=None)
    c = float(np.clip(c, 0.25, 4.0)) if slow > 1.0 else 1.0
    step = float(np.clip(cs / c, 0.0, whole))
    return dataclasses.replace(link, alpha=whole - step, step=step, crowded=c)


def measure_steps(rounds: int) -> dict[str, float]:
    """On every rank of a job: seconds of a :data:`PROBE_BYTES` all-reduce per :data:`STEP_PROBES`
    algorithm, the fastest of ``rounds`` medians."""
    x = np.zeros(PROBE_BYTES, np.uint8)
    return {name: min(_synced(lambda name=name: dist.all_reduce(x, algorithm=name), 100) for _ in range(rounds))
            for name in STEP_PROBES}


def local_costs() -> tuple[dict[str, float], float]:
    """``({dtype name: gamma}, copy)``: seconds per byte of the SUM kernel per dtype and of a copy."""
    gamma = {}
    for dtype in dtypes.SUPPORTED:
        a = np.ones(LOCAL_BYTES // dtype.itemsize, dtype)
        b = np.ones_like(a)
        ufunc = kernel(ReduceOp.SUM, dtype)
        gamma[str(dtype)] = _timed(lambda: ufunc(a, b, out=a), 9, np.min) / a.nbytes  # noqa: B023 - called within this iteration
    a = np.ones(LOCAL_BYTES, np.uint8)
    b = np.empty_like(a)
    return gamma, _timed(lambda: np.copyto(b, a), 9, np.min) / a.nbytes


def _timed(fn, iters: int, stat=np.median) -> float:
    """Seconds per call of ``fn``: ``stat`` of ``iters`` timed calls, after one untimed call."""
    fn()
    times = np.empty(iters)
    for i in range(iters):
        start = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - start
    return float(stat(times))


def _iters(nbytes: int) -> int:
    return int(np.clip((64 << 20) // max(nbytes, 1), 7, 300))


def _synced(fn, iters: int) -> float:
    """The median call of ``fn`` after a barrier, so that both ranks start together."""
    dist.barrier()
    return _timed(fn, iters)


def measure_link() -> tuple[list[float], list[float]]:
    """On both ranks of a two-rank job: (one-way seconds per :data:`PING_SIZES`, exchange seconds
    per :data:`EXCHANGE_SIZES`)."""
    exchange = []
    for nbytes in EXCHANGE_SIZES:
        x, out = np.zeros(nbytes, np.uint8), np.zeros(2 * nbytes, np.uint8)
        exchange.append(_synced(lambda x=x, out=out: dist.all_gather_into_tensor(out, x, algorithm="ring"),
                                _iters(nbytes)))
    ping = []
    for nbytes in PING_SIZES:
        x = np.zeros(nbytes, np.uint8)

        def round_trip(x=x):
            # a two-rank broadcast is one message into the receiver's buffer, on the collectives'
            # transport (send/recv have links of their own); one from each rank is a round trip
            for root in (0, 1):
                dist.broadcast(x, src=root, algorithm="binomial")

        ping.append(_synced(round_trip, _iters(nbytes)) / 2)
    return ping, exchange


def tune(transport: str = "tcp", scope: str = "intra", rounds: int = 1) -> tuple[costmodel.Profile, dict]:
    """Measure, on each rank of an initialized two-rank job; return (the measured profile, the raw
    timings) on rank 0 and ``(None, {})`` elsewhere. With several ``rounds`` each size keeps its
    fastest round.

    Raises:
        ValueError: the job does not have exactly two ranks.
    """
    if dist.get_world_size() != 2:
        raise ValueError(f"tune measures between two ranks; this job has {dist.get_world_size()}")
    runs = [measure_link() for _ in range(rounds)]
    ping, exchange = (np.min([run[i] for run in runs], axis=0) for i in (0, 1))
    if dist.get_rank() != 0:
        dist.barrier()  # rank 0 measures the local costs alone
        return None, {}
    gamma, copy = local_costs()
    dist.barrier()
    link = fit_link(PING_SIZES, ping, EXCHANGE_SIZES, exchange, copy)
    machine = (f"{platform.node()}: {os.cpu_count()} cpus, {platform.machine()}, Python {platform.python_version()}, "
               f"measured {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    profile = costmodel.DEFAULT.updated({(transport, scope): link}, gamma, copy, machine, os.cpu_count() or 0)
    raw = {"one_way": dict(zip(PING_SIZES, ping.tolist())), "exchange": dict(zip(EXCHANGE_SIZES, exchange.tolist()))}
    return profile, raw


def describe(profile: costmodel.Profile) -> list[str]:
    """Human-readable lines for the links, the float32 gamma, the copy cost and the cores of ``profile``."""
    lines = []
    for transport, scope, link in profile.links:
        lines.append(f"# {transport} {scope}-host: alpha {link.alpha * 1e6:.1f} us, beta {link.beta * 1e9:.3f} ns/B "
                     f"({1 / link.beta / 1e9 if link.beta else float('inf'):.2f} GB/s), duplex {link.duplex:.2f}")
    gamma = profile.gamma_for("float32")
    lines.append(f"# gamma float32: {gamma * 1e9:.3f} ns/B ({1 / gamma / 1e9:.2f} GB/s); "
                 f"copy {profile.copy * 1e9:.3f} ns/B; cores per host: {profile.cores or 'unknown'}")
    return lines


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand."""
    parser = subparsers.add_parser(
        "tune",
        help="measure alpha, beta and gamma on this machine and store the cost profile",
        description="Measure per-message latency (alpha), per-byte time (beta) and duplex between two ranks, "
        "and reduction speed (gamma) per dtype; store them as the profile that algorithm='auto' plans with.",
        epilog="examples: allreduce tune; allreduce tune --output prof.json; across two hosts: "
        "allreduce run --nnodes 2 ... -- python -m allreduce tune --job --scope inter",
    )
    parser.add_argument("--output", metavar="PATH", default=None,
                        help="profile file to update (default: ALLREDUCE_PROFILE or ~/.cache/allreduce/profile.json)")
    parser.add_argument("--scope", choices=costmodel.SCOPES, default="intra",
                        help="intra: the two ranks share a host (default); inter: they are on different hosts")
    parser.add_argument("--transport", choices=("all",) + costmodel.TRANSPORTS, default="all",
                        help="the transport to measure; all: tcp, and shm where this machine has it (default)")
    parser.add_argument("--rounds", type=launcher.int_at_least(1), default=3,
                        help="measure this many times, keeping each size's fastest round (default 3)")
    parser.add_argument("--job", action="store_true",
                        help="run as one of the two ranks of the current job instead of starting them")
    parser.add_argument("--raw", action="store_true", help="also print the raw timings")
    parser.add_argument("--steps", action="store_true",
                        help=f"with --job: measure only the per-step cost, as one of {STEP_RANKS} ranks of one host")
    parser.set_defaults(main=main, error=parser.error)
    return parser


def transports(requested: str, scope: str) -> list[str]:
    """The transports ``tune`` measures: between hosts only TCP; ``all`` adds shm where available."""
    if scope == "inter" or requested == "tcp":
        if requested == "shm":
            raise ValueError("shared memory does not reach other hosts; measure --scope inter with --transport tcp")
        return ["tcp"]
    if requested == "shm" or shm.available():
        return ["tcp", "shm"][requested == "shm":]
    return ["tcp"]


def main(args: argparse.Namespace) -> int:
    """Run the ``tune`` subcommand: start two ranks per transport (or be one), measure, store, print."""
    settings = Settings.from_env()
    output = args.output or settings.profile or costmodel.default_path(settings.cache_home)
    try:
        chosen = transports(args.transport, args.scope)
    except ValueError as exc:
        args.error(str(exc))
    if not args.job:
        for transport in chosen:
            print(f"# measuring the {transport} {args.scope}-host link between two ranks (about 10 s per round)...",
                  file=sys.stderr, flush=True)
            cmd = [sys.executable, "-m", "allreduce", "tune", "--job", "--output", output, "--scope", args.scope,
                   "--transport", transport, "--rounds", str(args.rounds)] + (["--raw"] if args.raw else [])
            status = launcher.launch(launcher.LaunchConfig(nproc=2, tag_output=False), cmd,
                                     {"ALLREDUCE_TRANSPORT": transport})  # the group measures this one
            if status == 0 and args.scope == "intra":
                print(f"# measuring the {transport} per-step cost on {STEP_RANKS} ranks...", file=sys.stderr,
                      flush=True)
                status = launcher.launch(launcher.LaunchConfig(nproc=STEP_RANKS, tag_output=False),
                                         cmd + ["--steps"], {"ALLREDUCE_TRANSPORT": transport})
            if status:
                return status
        return 0
    if len(chosen) != 1:
        args.error("with --job, name the transport the job uses: --transport tcp or shm")
    if settings.transport != chosen[0]:
        args.error(f"with --job, run the job with ALLREDUCE_TRANSPORT={chosen[0]}, the transport it measures")
    try:
        dist.init_process_group()
    except ValueError as exc:
        args.error(f"{exc}; or leave out --job to start two ranks here")
    if args.steps:
        return _tune_steps(chosen[0], output, args.rounds)
    try:
        measured, raw = tune(chosen[0], args.scope, args.rounds)
    except ValueError as exc:
        args.error(str(exc))
    finally:
        dist.destroy_process_group()
    if measured is None:
        return 0
    kept = costmodel.load(output) if os.path.exists(output) else costmodel.DEFAULT
    link = measured.link(chosen[0], args.scope)
    profile = kept.updated({(chosen[0], args.scope): link}, dict(measured.gamma), measured.copy, measured.machine,
                           measured.cores)
    costmodel.save(profile, output)
    print(f"# {chosen[0]} {args.scope}-host link measured; cost profile written to {output}")
    for line in describe(profile):
        print(line)
    if args.raw:
        print(json.dumps(raw, indent=1))
    print(json.dumps(profile.to_json(), indent=1))
    return 0


def _tune_steps(transport: str, output: str, rounds: int) -> int:
    """As one rank of a job on one host: measure the per-step cost and add it to the profile's link."""
    size, rank = dist.get_world_size(), dist.get_rank()
    try:
        seconds = measure_steps(rounds)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    kept = costmodel.load(output) if os.path.exists(output) else costmodel.DEFAULT
    link = fit_step(kept.link(transport, "intra"), seconds, size, os.cpu_count() or 0)
    costmodel.save(kept.updated({(transport, "intra"): link}), output)
    print(f"# {transport} on {size} ranks ({', '.join(f'{k} {v * 1e6:.0f} us' for k, v in seconds.items())}): "
          f"{link.step * 1e6:.1f} us per step, {link.alpha * 1e6:.1f} us per message, crowded {link.crowded:.2f}")
    return 0
