"""``allreduce run``: start the worker processes of one node and watch them until the job ends.

The flow is parse -> :class:`LaunchConfig` -> :func:`launch`. Every flag can also come from the
environment, so a scheduler can set a whole job up without touching the command line.

Each worker is an ordinary process with the rendezvous environment set (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``ALLREDUCE_JOB_ID``), which ``init_process_group()`` reads, horovodrun's (``HOROVOD_RANK``,
``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE``, ``HOROVOD_CROSS_RANK``,
``HOROVOD_CROSS_SIZE``) for scripts written for Horovod, and stdin from /dev/null. Unless the user
set ``ALLREDUCE_SECRET``, a single-node job gets a fresh random one, with which every connection of the
job authenticates (:mod:`allreduce.auth`); the nodes of a multi-node job must share one the user sets.
The launcher forwards SIGINT, SIGTERM, SIGHUP (a closed terminal) and SIGQUIT to each worker's whole
process group, waits a grace period, then kills what is left; nothing outlives it (:mod:`.workers`).
A job is all or nothing: the first worker to fail stops the others, because its peers would only
block until their own timeouts; unless ``--min-np M`` says the workers go on without it (they call
``allreduce.shrink_group``, see docs/fault-tolerance.md) while at least ``M`` of this node's live.
With ``--max-np K`` as well, each death that leaves fewer than ``K`` alive starts a replacement worker
(tagged by a launch number from the world size on) that waits in a lobby this launcher hosts until
the others let it in (``allreduce.grow_group``; hvd.elastic at a commit); one never let in is stopped
once the others have finished.
The exit status is the failed worker's (``128 + signal`` when a signal killed it), ``128 + signal``
when the launcher itself was stopped by one of the signals above (130 for SIGINT, 143 for SIGTERM),
and 0 when every worker exited 0 (with ``--min-np``, every worker that went on).

With output tagging on, each line of a worker's comes behind a ``[rank] `` prefix, and a traceback that
ends in an allreduce error (or ``KeyboardInterrupt``) is shown as its one last line, which names the
rank, the collective and the cause, and where the program was (:mod:`.tracebacks`);
``ALLREDUCE_DEBUG=INFO`` or ``DETAIL`` shows it whole. Workers log warnings, such as a rendezvous still
waiting for a node, unless ``ALLREDUCE_DEBUG`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import threading
from dataclasses import dataclass

from .workers import Job, say

_EXIT_NOT_FOUND = 127  # the shell's code for a command that cannot be started
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # what stops the job
QUIET = {"ALLREDUCE_DEBUG": "WARN"}  # workers' logging unless the user sets it: only what needs attention


@dataclass(frozen=True)
class LaunchConfig:
    """How many workers to start here, and where this node sits in the job."""

    nproc: int = 1  # workers on this node (LOCAL_WORLD_SIZE)
    nnodes: int = 1  # nodes in the job; WORLD_SIZE = nnodes * nproc
    node_rank: int = 0  # this node's index in [0, nnodes) (GROUP_RANK)
    master_addr: str | None = None  # rank 0's host; single node: 127.0.0.1 when unset
    master_port: int | None = None  # rendezvous port; single node: a free one when unset
    tag_output: bool = True  # prefix each worker's output lines with "[rank] "
    grace_s: float = 3.0  # between SIGTERM and SIGKILL when stopping workers
    min_np: int | None = None  # the others go on after a failure while this many workers live (None: all or nothing)
    max_np: int | None = None  # below this many live workers, replacements are started to join the others

    def __post_init__(self):
        if self.nproc < 1:
            raise ValueError(f"the number of workers per node must be at least 1, got {self.nproc}")
        if self.nnodes < 1:
            raise ValueError(f"the number of nodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node rank {self.node_rank} is outside [0, {self.nnodes}) for {self.nnodes} node(s)")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise ValueError(f"master port must be in 1..65535, got {self.master_port}")
        if self.nnodes > 1 and (not self.master_addr or self.master_port is None):
            raise ValueError(
                "a job of several nodes needs --master-addr and --master-port "
                "(or MASTER_ADDR and MASTER_PORT) naming rank 0's host, the same on every node"
            )
        if self.min_np is not None and not 1 <= self.min_np <= self.nproc:
            raise ValueError(f"--min-np must be in 1..{self.nproc} (the workers of this node), got {self.min_np}")
        if self.max_np is not None and (self.min_np is None or self.nnodes > 1
                                        or not self.min_np <= self.max_np <= self.nproc):
            raise ValueError(f"--max-np must come with --min-np, on a single node, in --min-np..{self.nproc} "
                             f"(replacements take dead workers' places), got {self.max_np}")
        if self.grace_s < 0:
            raise ValueError(f"grace period must not be negative, got {self.grace_s}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it when we bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_env(config: LaunchConfig, local_rank: int, master_addr: str, master_port: int,
               job_id: str) -> dict[str, str]:
    """The variables that tell worker ``local_rank`` of this node who it is and where to meet the others:
    torchrun's, and horovodrun's (``HOROVOD_RANK`` ...), which scripts written for Horovod read."""
    place = {
        "RANK": str(config.node_rank * config.nproc + local_rank),
        "WORLD_SIZE": str(config.world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(config.nproc),
        "GROUP_RANK": str(config.node_rank),
    }
    horovod = dict(zip(("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                        "HOROVOD_CROSS_RANK"), place.values()))
    return {**place, **horovod, "HOROVOD_CROSS_SIZE": str(config.nnodes), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port), "ALLREDUCE_JOB_ID": job_id, "PYTHONUNBUFFERED": "1"}


def launch(config: LaunchConfig, cmd: list[str], extra_env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` as ``config.nproc`` workers on this node and wait for the job to end.

    Args:
        config: how many workers, and this node's place in the job.
        cmd: the program and its arguments, run as is by every worker.
        extra_env: variables set for every worker on top of this process's environment.

    Returns:
        The job's exit status: 0 when every worker exited 0; the first failed worker's code (``128 +
        signal`` if a signal killed it); ``128 + signal`` if the launcher got SIGINT, SIGTERM, SIGHUP
        or SIGQUIT; 127 if the command could not be started.

    Raises:
        ValueError: ``cmd`` is empty.

    Example: ``launch(LaunchConfig(nproc=2), ["python", "train.py"])`` runs ranks 0 and 1 of a
    two-rank job on 127.0.0.1 and returns 0 once both have exited 0.
    """
    if not cmd:
        raise ValueError("no command to run: give the worker's command after '--'")
    master_addr = config.master_addr or "127.0.0.1"
    master_port = config.master_port if config.master_port is not None else free_port()
    job_id = secrets.token_hex(8)
    secret = _job_secret(config)
    job = Job(config)
    with _signals_forwarded_to(job):
        try:
            try:
                for local_rank in range(config.nproc):
                    env = worker_env(config, local_rank, master_addr, master_port, job_id)
                    env = {**QUIET, **os.environ, **(extra_env or {}), **env, **secret}
                    if config.max_np is not None and job.lobby is None:
                        job.open_lobby(cmd, env)
                    job.start(local_rank, cmd, {**env, **(job.lobby.env if job.lobby else {})})
            except OSError as exc:
                say(f"cannot start {cmd[0]!r}: {exc.strerror or exc}")
                job.stop(signal.SIGTERM)
                return _EXIT_NOT_FOUND
            return job.wait()
        finally:
            job.reap()  # whatever happened, nothing of the job outlives the launcher
            if job.lobby is not None:
                job.lobby.close()


def _job_secret(config: LaunchConfig) -> dict[str, str]:
    """``ALLREDUCE_SECRET`` for the workers: a fresh one for a single node unless the user set it."""
    if os.environ.get("ALLREDUCE_SECRET"):
        return {}
    if config.nnodes == 1:
        return {"ALLREDUCE_SECRET": secrets.token_hex(32)}
    say("ALLREDUCE_SECRET is not set: connections are only checked for group membership, not "
         "authenticated; export the same secret on every node")
    return {}



def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand; each flag defaults to its environment variable when that is set."""
    env = os.environ.get
    parser = subparsers.add_parser(
        "run",
        help="start N workers on this node with the rendezvous environment set",
        description="Start N copies of a command on this node as ranks of one job, with RANK, WORLD_SIZE, "
        "LOCAL_RANK, MASTER_ADDR, MASTER_PORT... set, and stop them all if one fails.",
        epilog="example: allreduce run -n 4 -- python train.py --epochs 3",
    )
    parser.add_argument("-n", "--nproc-per-node", dest="nproc", metavar="N", type=int_at_least(1),
                        default=env("ALLREDUCE_NPROC", "1"),
                        help="workers on this node (env ALLREDUCE_NPROC; default 1)")
    parser.add_argument("--nnodes", metavar="K", type=int_at_least(1), default=env("ALLREDUCE_NNODES", "1"),
                        help="nodes in the job (env ALLREDUCE_NNODES; default 1)")
    parser.add_argument("--node-rank", metavar="I", type=int_at_least(0), default=env("ALLREDUCE_NODE_RANK", "0"),
                        help="this node's index, 0..K-1 (env ALLREDUCE_NODE_RANK; default 0)")
    parser.add_argument("--master-addr", metavar="ADDR", default=env("MASTER_ADDR"),
                        help="host of rank 0 (env MASTER_ADDR; default 127.0.0.1 on a single node)")
    parser.add_argument("--master-port", metavar="PORT", type=int_at_least(1), default=env("MASTER_PORT"),
                        help="rendezvous port on that host (env MASTER_PORT; default a free port on a single node)")
    parser.add_argument("--min-np", metavar="M", type=int_at_least(1), default=env("ALLREDUCE_MIN_NP"),
                        help="after a worker fails, let the others go on while at least M live: they shrink "
                        "their groups and finish (env ALLREDUCE_MIN_NP; default: one failure stops the job)")
    parser.add_argument("--max-np", metavar="K", type=int_at_least(1), default=env("ALLREDUCE_MAX_NP"),
                        help="with --min-np: while fewer than K workers live, start replacements that join the "
                        "others at their next grow_group (hvd.elastic: their next commit) (env ALLREDUCE_MAX_NP)")
    parser.add_argument("--tag-output", action=argparse.BooleanOptionalAction, default=True,
                        help="prefix each output line with the worker's [rank]")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command every worker runs")
    parser.set_defaults(main=main, error=parser.error)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run the ``run`` subcommand from its parsed arguments; returns the job's exit status."""
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        args.error("no command to run: give the worker's command after '--', "
                   "e.g. allreduce run -n 2 -- python train.py")
    try:
        config = LaunchConfig(
            nproc=args.nproc,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
            tag_output=args.tag_output,
            min_np=args.min_np,
            max_np=args.max_np,
        )
    except ValueError as exc:
        args.error(str(exc))
    return launch(config, cmd)


def int_at_least(low: int):
    """An argparse ``type``: an integer no smaller than ``low``, with an error message that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


@contextlib.contextmanager
def _signals_forwarded_to(job: Job):
    """While the job runs, turn the signals that stop a job (:data:`_FORWARDED`) into events it acts on."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = {s: signal.signal(s, lambda signum, _frame: job.events.put(("signal", signum))) for s in _FORWARDED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
