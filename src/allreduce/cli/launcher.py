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
Workers start in their own session, so a Ctrl-C in the terminal reaches only the launcher, which
decides what they get: it forwards SIGINT, SIGTERM, SIGHUP (a closed terminal) and SIGQUIT to each
worker's whole process group, waits a grace period, then kills what is left. Nothing outlives the
launcher: on Linux each worker asks the kernel, before it executes the command, to SIGKILL it when
the launcher dies, so a launcher killed outright (SIGKILL, the OOM killer) takes its workers along.
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

With output tagging on, a reader thread per pipe copies each line to our stdout or stderr behind a
``[rank] `` prefix, whole lines under one lock, so lines from different ranks never interleave. A
worker's traceback that ends in an allreduce error (or ``KeyboardInterrupt``) is shown as its one
last line, which names the rank, the collective and the cause, and where the program was
(:mod:`.tracebacks`); ``ALLREDUCE_DEBUG=INFO`` or ``DETAIL`` shows it whole. Workers log warnings,
such as a rendezvous still waiting for a node, unless ``ALLREDUCE_DEBUG`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .tracebacks import Condenser

_EXIT_NOT_FOUND = 127  # the shell's code for a command that cannot be started
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal the calling process gets when its parent dies
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
    job = _Job(config)
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
                _say(f"cannot start {cmd[0]!r}: {exc.strerror or exc}")
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
    _say("ALLREDUCE_SECRET is not set: connections are only checked for group membership, not "
         "authenticated; export the same secret on every node")
    return {}


class _Job:
    """The workers of this node: started, watched through one event queue, and stopped together."""

    def __init__(self, config: LaunchConfig):
        self.config = config
        self.procs: dict[int, subprocess.Popen] = {}  # by rank
        self.running = 0  # workers whose exit we have not seen yet
        # ("exit", rank, returncode) from the watcher threads, ("signal", signum) from our handlers;
        # a SimpleQueue because a signal handler may put while the main thread is inside get().
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.write_lock = threading.Lock()
        self.guard = _orphan_guard()
        self.lobby = None  # with --max-np: where replacements wait (cli/lobby.py)
        self.replacements: dict[int, subprocess.Popen] = {}  # by launch number, from world_size on
        self.dismissed: set[int] = set()  # replacements stopped because the job ended before they joined
        self._replacement_of: tuple[list[str], dict[str, str]] | None = None  # its command and environment

    def open_lobby(self, cmd: list[str], env: dict[str, str]) -> None:
        from .lobby import Lobby  # only a job that may grow needs the library's store
        self.lobby = Lobby(env)
        self._replacement_of = cmd, {**env, **self.lobby.replacement_env}

    def replace(self) -> None:
        """Start a replacement worker (its output tagged by its launch number) that joins the others."""
        number = self.config.world_size + len(self.replacements)
        cmd, env = self._replacement_of
        self.start(number - self.config.node_rank * self.config.nproc, cmd, env)
        self.replacements[number] = self.procs[number]
        _say(f"started a replacement worker [{number}]; it joins the others at their next grow "
             f"(--max-np {self.config.max_np})")

    def start(self, local_rank: int, cmd: list[str], env: dict[str, str]) -> None:
        rank = self.config.node_rank * self.config.nproc + local_rank
        pipe = subprocess.PIPE if self.config.tag_output else None
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe,
                                start_new_session=True, preexec_fn=self.guard)
        self.procs[rank] = proc
        self.running += 1
        if self.config.tag_output:
            prefix = f"[{rank}] ".encode()
            whole = env.get("ALLREDUCE_DEBUG", "").upper() in ("INFO", "DETAIL")  # every traceback, unabridged
            self._spawn(_copy_lines, proc.stdout, sys.stdout, prefix, self.write_lock)
            self._spawn(_copy_lines, proc.stderr, sys.stderr, prefix, self.write_lock, None if whole else Condenser())
        self._spawn(lambda: self.events.put(("exit", rank, proc.wait())))

    def wait(self) -> int:
        """Block until every worker exited 0, one failed, or we were interrupted; return the exit code."""
        while self.running:
            event = self.events.get()
            if event[0] == "signal":
                signum = event[1]
                _say(f"got {signal.Signals(signum).name}, stopping {self.running} worker(s)")
                self.stop(signum)
                return 128 + signum
            _, rank, code = event
            self.running -= 1
            if rank in self.dismissed:
                continue
            if code != 0 and self.config.min_np is not None and self.running >= self.config.min_np:
                _say(f"rank {rank} {_describe(code)}; the other {self.running} worker(s) go on "
                     f"(--min-np {self.config.min_np})")
                if self.lobby is not None and self.running < self.config.max_np \
                        and len(self.replacements) < self.config.nproc:
                    self.replace()
                continue
            if code == 0 and self.lobby is not None:
                self._dismiss_outside()
            if code != 0:
                _say(f"rank {rank} {_describe(code)}; stopping the other {self.running} worker(s)")
                self.stop(signal.SIGTERM)
                return 128 - code if code < 0 else code
        return 0

    def _dismiss_outside(self) -> None:
        """Once only replacements that were never let in still run, the job is done: stop them."""
        running = {proc.pid for proc in self.procs.values() if proc.poll() is None}
        waiting = {proc.pid for proc in self.replacements.values()} & running
        if running and waiting == running and self.lobby.outside(waiting) == waiting:
            _say(f"the others finished before {len(waiting)} replacement worker(s) could join; stopping them")
            for number, proc in self.replacements.items():
                if proc.pid in waiting:
                    self.dismissed.add(number)
                    _kill_group(proc, signal.SIGTERM)

    def stop(self, signum: int) -> None:
        """Send ``signum`` to every live worker; SIGKILL them after the grace period or a second signal."""
        self._signal_all(signum)
        deadline = time.monotonic() + self.config.grace_s
        while self.running:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if event[0] == "signal":  # asked again: no more grace
                break
            self.running -= 1
        self._signal_all(signal.SIGKILL)

    def reap(self) -> None:
        """Kill what a worker left behind in its process group, wait for all, flush the tagged output."""
        for proc in self.procs.values():
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
        for thread in self.threads:
            thread.join(timeout=1.0)

    def _signal_all(self, signum: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                _kill_group(proc, signum)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)


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


def _orphan_guard():
    """A ``preexec_fn`` that has the kernel SIGKILL the worker when the launcher dies, however it dies:
    Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``); ``None`` where there is none.

    It runs in the child between fork and exec, and does nothing there but two system calls, so the
    launcher's threads cannot deadlock it. The signal comes when the thread that started the worker
    ends, which is the thread that waits for the job. A launcher that died before the request took
    effect has already orphaned the child, which the parent's pid tells: then it dies at once.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # no C library to ask: the launcher's own signal handling remains
        return None
    launcher = os.getpid()
    option, signum = ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL)

    def guard() -> None:
        prctl(option, signum)
        if os.getppid() != launcher:
            os.kill(os.getpid(), signal.SIGKILL)

    return guard


@contextlib.contextmanager
def _signals_forwarded_to(job: _Job):
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


def _copy_lines(src, dst, prefix: bytes, lock: threading.Lock, condenser: Condenser | None = None) -> None:
    """Copy each line from the worker's pipe ``src`` to ``dst`` behind ``prefix``, whole lines at a time,
    through ``condenser`` (which shortens the tracebacks of allreduce errors) when one is given."""
    with src:
        for line in iter(src.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            _put(dst, prefix, condenser.feed(line) if condenser else [line], lock)
    if condenser:
        _put(dst, prefix, condenser.end(), lock)


def _put(dst, prefix: bytes, lines: list[bytes], lock: threading.Lock) -> None:
    if lines:
        with lock, contextlib.suppress(OSError, ValueError):  # our output is gone: drain, don't block
            _write(dst, b"".join(prefix + line for line in lines))


def _write(stream, data: bytes) -> None:
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        binary.write(data)
    else:  # a text-only stream, e.g. one a test put in place of sys.stdout
        stream.write(data.decode(errors="replace"))
    stream.flush()


def _kill_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def _describe(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:  # a signal without a name, e.g. a real-time one
        name = f"signal {-returncode}"
    return f"was killed by {name} (exit code {128 - returncode})"


def _say(message: str) -> None:
    print(f"allreduce run: {message}", file=sys.stderr, flush=True)
