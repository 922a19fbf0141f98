"""The ``allreduce`` command: one subcommand per module, dispatched by argparse.

Each subcommand lives in the module that does the work, which exposes ``add_parser(subparsers)``; that
parser sets ``main`` (the function to run with the parsed arguments, returning the exit status) and
``error`` (its own ``parser.error``, for mistakes only visible once flags are combined). A new
subcommand is one more entry in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse

from .. import __version__
from . import bench, info, launcher, plan, simulate, soak, tune

COMMANDS = (launcher, bench, tune, plan, simulate, soak, info)  # modules that each add one subcommand


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand of :data:`COMMANDS` added."""
    parser = argparse.ArgumentParser(prog="allreduce", description="Collective communication for Python processes.")
    parser.add_argument("--version", action="version", version=f"allreduce {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def names() -> list[str]:
    """The subcommands' names, in the order of :data:`COMMANDS`."""
    subparsers = argparse.ArgumentParser(prog="allreduce").add_subparsers()
    return [module.add_parser(subparsers).prog.split()[-1] for module in COMMANDS]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand and return its exit status (130 after
    Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        return args.main(args)
    except KeyboardInterrupt:  # Ctrl-C: the shell's status for SIGINT, without a traceback
        return 130
