"""``allreduce info``: the report a user pastes into a bug: versions, what this machine offers, settings.

It reads package versions from their metadata (importing torch would take seconds), tries each
transport's system facility here (memfd segments, Unix sockets for shared memory, a
``process_vm_readv`` of our own memory for cross-memory attach), names the cost profile the planner
would use, lists the ``ALLREDUCE_*`` and launcher variables that are set (the secret masked), and says
which launcher environment :func:`allreduce.rendezvous.from_environment` detects.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import os
import platform
import sys

from .. import __version__, native, rendezvous
from ..planner import costmodel
from ..settings import Settings
from ..transport import cma, shm, shmseg
from . import variables

PACKAGES = ("numpy", "ml_dtypes", "torch", "rich", "matplotlib", "mpi4py")  # versions reported, when installed
SECRETS = ("ALLREDUCE_SECRET",)  # set or not, never the value


def report(environ: dict[str, str] | None = None) -> list[str]:
    """The lines of the report, for the environment ``environ`` (default: this process's)."""
    env = dict(os.environ if environ is None else environ)
    lines = [f"allreduce {__version__}",
             f"python {platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
             f"platform {platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs"]
    lines.append("packages: " + ", ".join(f"{name} {_version(name)}" for name in PACKAGES))
    lines.append("transports here:")
    lines += [f"  {name:<14} {verdict}" for name, verdict in transports()]
    lines.append(f"engine: {engine(env)}")
    lines.append(f"cost profile: {profile_in_use(env)}")
    lines.append(f"launcher environment: {launcher(env)}")
    ours = {name for name, _ in variables.library()}
    set_here = sorted(name for name in env if name in ours or name.startswith("ALLREDUCE_")
                      or name.startswith(variables.LAUNCHER_PREFIXES))
    lines.append("variables set:" + ("" if set_here else " none"))
    lines += [f"  {name}={'(set, hidden)' if name in SECRETS else env[name]}" for name in set_here]
    return lines


def transports() -> list[tuple[str, str]]:
    """``(transport, verdict)`` for TCP, shared memory, memfd and cross-memory attach on this machine."""
    return [
        ("tcp", "yes"),
        ("shm", "yes" if shm.available() else "no (needs Linux memfd, Unix seqpacket sockets and x86-64)"),
        ("memfd", "yes" if shmseg.available() else "no (not Linux)"),
        ("cma", _cross_memory()),
    ]


def _cross_memory() -> str:
    """Whether ``process_vm_readv`` works here, with the Yama setting that decides it between ranks."""
    probe = ctypes.create_string_buffer(b"allreduce-probe!")
    if not cma.readable(os.getpid(), ctypes.addressof(probe), probe.raw):
        return "no (process_vm_readv refused: seccomp or no such call); shared-memory copies are used"
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except (OSError, ValueError):
        return "yes"
    if scope >= 2:
        return f"no between ranks (kernel.yama.ptrace_scope={scope}); shared-memory copies are used"
    return f"yes (kernel.yama.ptrace_scope={scope})"


def engine(env: dict[str, str]) -> str:
    """Which engine runs the shared-memory lines and the schedules here, and why: the compiled one where
    ``ALLREDUCE_ENGINE`` allows it and it was built (schedules over plain TCP links; TLS and shared
    memory schedules run in Python)."""
    try:
        module, why = native.chosen("line_plans", Settings.from_env(env))
    except (ImportError, ValueError) as exc:
        return f"none: {exc}"
    if module is None:
        return f"python ({why})"
    tcp, _ = native.load("tcp")
    schedules = "native for schedules over plain TCP, python for the others" if tcp else "python for schedules"
    return (f"native for the shared-memory lines ({why}; ALLREDUCE_ENGINE={env.get('ALLREDUCE_ENGINE') or 'auto'}), "
            f"{schedules}")


def profile_in_use(env: dict[str, str]) -> str:
    """Which cost profile the planner reads: ``ALLREDUCE_PROFILE``, the user's cache, or the built-in one."""
    named = env.get("ALLREDUCE_PROFILE")
    path = named or costmodel.default_path(env.get("XDG_CACHE_HOME", ""))
    if os.path.exists(path):
        return f"{path} ({'ALLREDUCE_PROFILE' if named else 'written by `allreduce tune`'})"
    if named:
        return f"{path} (ALLREDUCE_PROFILE names a missing file: collectives will fail to plan)"
    return f"built-in defaults (no {path}; `allreduce tune` measures this machine)"


def launcher(env: dict[str, str]) -> str:
    """The launcher family whose variables are set, and the rank, world size and store it gives."""
    try:
        info = rendezvous.from_environment(env)
    except ValueError as exc:
        return f"invalid: {exc}"
    if info.source == "none":
        return "none (not inside a job: `allreduce run -n N -- ...`, torchrun, mpirun or srun set one up)"
    agent = ", store hosted by torchrun's agent" if info.agent_store else ""
    return (f"{info.source}: rank {info.rank} of {info.world_size}, local rank {info.local_rank} of "
            f"{info.local_world_size}, store {info.master_addr}:{info.master_port}{agent}")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``info`` subcommand."""
    parser = subparsers.add_parser(
        "info", help="versions, transports, settings and launcher seen here (paste it into a bug report)",
        description="Print allreduce's and its dependencies' versions, the transports this machine offers, "
        "the cost profile in use, the variables set and the launcher environment detected.")
    parser.set_defaults(main=main, error=parser.error)
    return parser


def main(args: argparse.Namespace) -> int:
    """Print the report; always 0."""
    print("\n".join(report()))
    return 0
