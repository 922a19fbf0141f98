"""The workers of one node as one job: started, watched through one event queue, stopped together.

Workers start in their own session, so a Ctrl-C in the terminal reaches only the launcher, which
decides what they get (:meth:`Job.stop`: the signal, a grace period, then SIGKILL for what is left).
Nothing outlives the launcher: on Linux each worker asks the kernel, before it executes the command, to
SIGKILL it when the launcher dies, so a launcher killed outright (SIGKILL, the OOM killer) takes its
workers along. With ``--max-np`` a death can start a replacement worker that waits in the lobby
(:mod:`.lobby`) until the others let it in, and is stopped if they finish first.

With output tagging on, a reader thread per pipe copies each line to our stdout or stderr behind a
``[rank] `` prefix, whole lines under one lock, so lines from different ranks never interleave; a
worker's traceback that ends in an allreduce error is condensed to its last line (:mod:`.tracebacks`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from .tracebacks import Condenser

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal the calling process gets when its parent dies


class Job:
    """The workers of this node: started, watched through one event queue, and stopped together."""

    def __init__(self, config):  # the launcher's LaunchConfig (this module imports no launcher)
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
        say(f"started a replacement worker [{number}]; it joins the others at their next grow "
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
                say(f"got {signal.Signals(signum).name}, stopping {self.running} worker(s)")
                self.stop(signum)
                return 128 + signum
            _, rank, code = event
            self.running -= 1
            if rank in self.dismissed:
                continue
            if code != 0 and self.config.min_np is not None and self.running >= self.config.min_np:
                say(f"rank {rank} {_describe(code)}; the other {self.running} worker(s) go on "
                     f"(--min-np {self.config.min_np})")
                if self.lobby is not None and self.running < self.config.max_np \
                        and len(self.replacements) < self.config.nproc:
                    self.replace()
                continue
            if code == 0 and self.lobby is not None:
                self._dismiss_outside()
            if code != 0:
                say(f"rank {rank} {_describe(code)}; stopping the other {self.running} worker(s)")
                self.stop(signal.SIGTERM)
                return 128 - code if code < 0 else code
        return 0

    def _dismiss_outside(self) -> None:
        """Once only replacements that were never let in still run, the job is done: stop them."""
        running = {proc.pid for proc in self.procs.values() if proc.poll() is None}
        waiting = {proc.pid for proc in self.replacements.values()} & running
        if running and waiting == running and self.lobby.outside(waiting) == waiting:
            say(f"the others finished before {len(waiting)} replacement worker(s) could join; stopping them")
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


def say(message: str) -> None:
    """Tell the user something about the job, on stderr, as the launcher."""
    print(f"allreduce run: {message}", file=sys.stderr, flush=True)
