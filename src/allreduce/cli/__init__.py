"""The ``allreduce`` command: one subcommand per module, dispatched by argparse.

Each subcommand lives in the module that does the work, which exposes ``add_parser(subparsers)``; that
parser sets ``main`` (the function to run with the parsed arguments, returning the exit status) and
``error`` (its own ``parser.error``, for mistakes only visible once flags are combined). A new
subcommand is one more entry in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse

from . import bench, launcher, plan, simulate, soak, tune

COMMANDS = (launcher, bench, tune, plan, simulate, soak)  # modules that each add one subcommand


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand of :data:`COMMANDS` added."""
    parser = argparse.ArgumentParser(prog="allreduce", description="Collective communication for Python processes.")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand and return its exit status."""
    args = build_parser().parse_args(argv)
    return args.main(args)
