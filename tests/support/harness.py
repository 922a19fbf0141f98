"""Run a function on N freshly forked ranks joined in one group, and collect what each returned.

``run_ranks(fn, n)`` forks ``n`` processes; each joins a group (``tcp://`` on a free loopback port),
calls ``fn(rank, size)``, and sends back its return value or its exception. Nothing here can hang the
suite: the parent kills every rank still alive at the deadline and reports which ones were stuck.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import socket
import time
import traceback

_CTX = mp.get_context("fork")


class RankFailed(Exception):
    """A rank raised; ``errors`` maps rank to (exception type name, message, traceback)."""

    def __init__(self, errors: dict):
        self.errors = errors
        super().__init__("\n".join(f"rank {r}: {t}: {m}\n{tb}" for r, (t, m, tb) in sorted(errors.items())))


class Hung(Exception):
    """Some ranks did not finish before the harness deadline."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, size, port, report, timeout, init, env):
    os.environ.update(env or {})
    try:
        import allreduce as dist

        if init:
            dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=timeout)
        value = fn(rank, size)
        if init and dist.is_initialized():
            dist.destroy_process_group()
        report.send(("ok", value))
    except BaseException as exc:  # reported to the parent, which decides
        report.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
    finally:
        report.close()


def run_ranks(fn, size: int, timeout: float = 30.0, deadline: float = 120.0, init: bool = True,
              env: dict | None = None, expect_errors: bool = False):
    """Run ``fn(rank, size)`` on ``size`` ranks; return the list of results in rank order.

    ``timeout`` is the group's collective timeout; ``deadline`` bounds the whole run. With
    ``expect_errors`` the result list holds ``("error", type_name, message)`` tuples for ranks that
    raised (and ``("killed", exitcode)`` for ranks that died) instead of raising :class:`RankFailed`.
    """
    port = free_port()
    procs, readers = [], {}
    for r in range(size):  # one pipe per rank: a rank killed while it reports blocks no other rank's report
        reader, writer = _CTX.Pipe(duplex=False)
        procs.append(_CTX.Process(target=_child, args=(fn, r, size, port, writer, timeout, init, env), daemon=True))
        procs[r].start()
        writer.close()  # closed before the next fork: the rank holds the only write end, so its death is EOF
        readers[reader] = r
    outcome: dict[int, tuple] = {}

    end = time.monotonic() + deadline
    while readers and time.monotonic() < end:
        ready = mp.connection.wait(list(readers), timeout=min(0.1, max(0.0, end - time.monotonic())))
        if not ready and not any(p.is_alive() for p in procs):
            break  # the rest died without a word (a child of theirs may still hold a pipe open)
        for reader in ready:
            rank = readers.pop(reader)
            try:
                outcome[rank] = reader.recv()
            except (EOFError, OSError):  # died before it reported, or while it did
                pass
            reader.close()
    for p in procs:
        p.join(timeout=max(0.0, min(5.0, end - time.monotonic())))
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    if stuck:
        raise Hung(f"ranks {stuck} of {size} did not finish within {deadline}s; finished: {sorted(outcome)}")
    values = []
    errors = {}
    for r, p in enumerate(procs):
        status, value = outcome.get(r, ("killed", p.exitcode))
        if status == "ok":
            values.append(value)
        elif expect_errors:
            values.append(("error", value[0], value[1]) if status == "error" else ("killed", value))
        else:
            errors[r] = value if status == "error" else ("killed", f"exit code {value}", "")
    if errors:
        raise RankFailed(errors)
    return values


def on_hosts(per_host: int, body):
    """A rank body (for ``run_ranks(..., init=False)``) that joins a group as host ``rank // per_host``
    (through ALLREDUCE_HOST_ID) first."""
    port = free_port()

    def run(rank, size):
        import allreduce as dist

        os.environ["ALLREDUCE_HOST_ID"] = f"host{rank // per_host}"
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=30)
        try:
            return body(rank, size)
        finally:
            dist.destroy_process_group()
    return run
