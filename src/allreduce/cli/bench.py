"""``allreduce bench``: time collectives over a sweep of sizes and print an nccl-tests style table.

What is timed, and how, is :mod:`.measuring`; this module is the subcommand and its output (the table,
the JSON file). Run it inside a job (``allreduce run -n 4 -- python -m allreduce bench``) or let it
start the job itself (``allreduce bench -n 4``); only rank 0 prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import allreduce as dist
from .. import dtypes
from ..ops import ReduceOp
from . import checks, launcher
from .measuring import COLLECTIVES, BenchOptions, Row, parse_size, plan, sweep
from .progress import Progress

_COLUMNS = (("size(B)", 12), ("count", 12), ("type", 9), ("op", 7), ("algo", 24),
            ("time(us)", 11), ("algbw(GB/s)", 12), ("busbw(GB/s)", 12), ("check", 6))


def format_header() -> str:
    """The column titles, as a comment line."""
    return "#" + "".join(f"{title:>{width}}" for title, width in _COLUMNS)[1:]


def format_row(row: Row) -> str:
    """One row of the table, aligned under :func:`format_header`."""
    check = "-" if row.correct is None else "ok" if row.correct else "WRONG"
    cells = (row.size, row.count, row.dtype, row.op, algorithm_label(row),
             f"{row.time_us:.2f}", f"{row.algbw:.3f}", f"{row.busbw:.3f}", check)
    return "".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, _COLUMNS))


def algorithm_label(row: Row) -> str:
    """The ``algo`` column: the algorithm asked for, or ``auto:NAME`` with the one the group chose."""
    return f"auto:{row.ran}" if row.ran else row.algorithm


def format_summary(rows: list[Row]) -> list[str]:
    """The closing comment lines: average bus bandwidth, and how many rows were wrong."""
    lines = [f"# avg busbw: {sum(r.busbw for r in rows) / max(1, len(rows)):.3f} GB/s over {len(rows)} rows"]
    wrong = sum(r.correct is False for r in rows)
    if wrong:
        lines.append(f"# {wrong} of {len(rows)} rows WRONG")
    return lines


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand."""
    parser = subparsers.add_parser(
        "bench",
        help="time collectives over a sweep of sizes (nccl-tests style table)",
        description="Time collectives over a sweep of sizes and print size, time, algorithm and bus bandwidth "
        "and a correctness check per row. Run it on every rank of a job, or give -n to start the job.",
        epilog="examples: allreduce bench -n 4 -e 16M; "
        "allreduce run -n 4 -- python -m allreduce bench --collective all",
    )
    parser.add_argument("-n", "--nproc", metavar="N", type=launcher.int_at_least(1), default=None,
                        help="start a job of N local ranks to run the benchmark "
                        "(default: run as a rank of the current job)")
    parser.add_argument("--collective", default="all_reduce",
                        help=f"what to time: {', '.join(COLLECTIVES)}, a comma list of them, "
                        "or all (default all_reduce)")
    parser.add_argument("-b", "--min-bytes", metavar="SIZE", type=_size, default="8", help="first size (default 8)")
    parser.add_argument("-e", "--max-bytes", metavar="SIZE", type=_size, default="64M",
                        help="last size (default 64M; suffixes K, M, G, KiB, MiB, GiB are powers of 1024)")
    parser.add_argument("-f", "--factor", type=launcher.int_at_least(2), default=2,
                        help="ratio between sizes (default 2)")
    parser.add_argument("--iters", type=launcher.int_at_least(1), default=20,
                        help="timed iterations per row (default 20)")
    parser.add_argument("--warmup", type=launcher.int_at_least(0), default=5,
                        help="untimed iterations per row (default 5)")
    parser.add_argument("--dtype", default="float32", type=checks.dtype_name([str(d) for d in dtypes.SUPPORTED]),
                        help=f"element type: {', '.join(str(d) for d in dtypes.SUPPORTED)} (default float32)")
    parser.add_argument("--op", default="sum", choices=[o.name.lower() for o in ReduceOp],
                        help="reduction for all_reduce, reduce and reduce_scatter (default sum)")
    parser.add_argument("--algorithm", default="auto",
                        help="algorithm, or a comma list for one row each; auto lets the group choose, "
                        "all takes every registered one (default auto)")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="verify every result")
    parser.add_argument("--json", metavar="PATH", type=checks.output_file,
                        help="also write the rows to PATH as JSON (rank 0)")
    parser.set_defaults(main=main, error=parser.error)
    return parser


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """:class:`BenchOptions` from parsed ``bench`` arguments; ``ValueError``/``TypeError`` if they clash."""
    return BenchOptions(
        collectives=COLLECTIVES if args.collective == "all" else _comma_list(args.collective),
        min_bytes=args.min_bytes,
        max_bytes=args.max_bytes,
        factor=args.factor,
        iters=args.iters,
        warmup=args.warmup,
        dtype=args.dtype,
        op=args.op,
        algorithms=_comma_list(args.algorithm),
        check=args.check,
    )


def to_argv(options: BenchOptions) -> list[str]:
    """The ``bench`` flags that give back ``options``: what a self-launched job passes to its ranks."""
    collective = "all" if options.collectives == COLLECTIVES else ",".join(options.collectives)
    return ["--collective", collective, "-b", str(options.min_bytes), "-e", str(options.max_bytes),
            "-f", str(options.factor), "--iters", str(options.iters), "--warmup", str(options.warmup),
            "--dtype", str(options.dtype), "--op", options.op.name.lower(),
            "--algorithm", ",".join(options.algorithms), "--check" if options.check else "--no-check"]


def main(args: argparse.Namespace) -> int:
    """Run the ``bench`` subcommand; 0 when every checked row is right, 1 otherwise."""
    try:
        options = options_from_args(args)
        nrows = len(plan(dist, options))  # checks the algorithm names before any rank starts
    except (ValueError, TypeError) as exc:
        args.error(str(exc))
    if args.nproc is not None:
        cmd = [sys.executable, "-m", "allreduce", "bench", *to_argv(options)]
        cmd += ["--json", args.json] if args.json else []
        return launcher.launch(launcher.LaunchConfig(nproc=args.nproc, tag_output=False), cmd)
    started = not dist.is_initialized()
    if started:
        try:
            dist.init_process_group()
        except ValueError as exc:  # not inside a job
            args.error(f"{exc}; or give -n N to start a job of N ranks")
    try:
        rows = _run(dist, options, nrows, args.json)
    finally:
        if started:
            dist.destroy_process_group()
    return 0 if all(row.correct is not False for row in rows) else 1


def _run(api, options: BenchOptions, nrows: int, json_path: str | None) -> list[Row]:
    rank, world = api.get_rank(), api.get_world_size()
    if rank != 0:
        return sweep(api, options)
    print(f"# allreduce bench: {world} ranks, {options.dtype}, op {options.op.name.lower()}, "
          f"{options.iters} iters after {options.warmup} warm-up, check {'on' if options.check else 'off'}")
    group = api.default_group()
    print(f"# engine: lines {group.engine}, schedules {group.schedules_engine}")
    print(format_header(), flush=True)
    headed = set()

    def on_row(row: Row) -> str:  # a "# collective" line above each collective's first row
        heading = [] if row.collective in headed else [f"# {row.collective}"]
        headed.add(row.collective)
        return "\n".join([*heading, format_row(row)])

    with Progress(nrows, "allreduce bench", every_s=float("inf")) as progress:  # each row is a line already

        def show(row: Row) -> None:
            progress.print(on_row(row))
            progress.advance()

        rows = sweep(api, options, on_row=show)
    for line in format_summary(rows):
        print(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"world_size": world, "options": _jsonable(options),
                       "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
    return rows


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(word.strip() for word in text.split(",") if word.strip())


def _jsonable(options: BenchOptions) -> dict:
    return {**dataclasses.asdict(options), "dtype": str(options.dtype), "op": options.op.name.lower()}


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
