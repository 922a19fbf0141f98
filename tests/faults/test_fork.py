"""A fork() child never uses nor releases its parent's groups: every call in it (a collective,
point-to-point, destroy) raises ``RuntimeError`` naming the fork and the pid, and its exit (``os._exit``,
or the normal path: atexit handlers, finalizers) leaves the parent's links, segments and store alone.

(Before, a child that destroyed its inherited group marked the parent's shared-memory links closed,
so the peer's next call failed; a child's all-reduce ran on the parent's links and returned success.)
"""

from __future__ import annotations

import atexit
import gc
import os

import numpy as np
import pytest
from support.harness import run_ranks

import allreduce as dist

REFUSED, TOUCHED = 0, 5  # the child's exit codes


def _child(how: str, group) -> None:
    """In the child: exit at once, or exit normally, or try the inherited groups; never returns."""
    code = 0
    try:
        if how == "calls":
            for call in (lambda: dist.all_reduce(np.ones(4, np.float32)),
                         lambda: dist.all_reduce(np.ones(4, np.float32), group=group),
                         lambda: dist.send(np.ones(4, np.float32), dst=1),
                         lambda: dist.new_group(),
                         lambda: dist.destroy_process_group(group),
                         lambda: dist.destroy_process_group()):
                try:
                    call()
                    code = TOUCHED
                except RuntimeError as exc:
                    if "fork" not in str(exc) or str(os.getppid()) not in str(exc):
                        code = TOUCHED
        elif how == "exit":  # what a normal exit runs (a destroy registered at exit), then finalizers
            atexit._run_exitfuncs()
            gc.collect()
    finally:
        os._exit(code)


def _forking(how: str):
    def body(rank, size):
        group = dist.new_group()
        x = np.ones(4, np.float32)
        dist.all_reduce(x, group=group)
        code = None
        if rank == 0:
            atexit.register(dist.destroy_process_group)  # as programs do; the child's raises, touching nothing
            pid = os.fork()
            if pid == 0:
                _child(how, group)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            atexit.unregister(dist.destroy_process_group)
        dist.barrier(group=group)
        sums = []
        for g in (None, group):
            x = np.full(4, rank + 1.0, np.float32)
            dist.all_reduce(x, group=g)
            sums.append(float(x[0]))
        y = np.zeros(4, np.float32)
        if rank == 0:
            dist.send(np.full(4, 9.0, np.float32), dst=1)
        else:
            dist.recv(y, src=0)
        dist.destroy_process_group(group)
        return code, sums, float(y[0])
    return body


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("how", ["_exit", "exit", "calls"])
def test_a_forked_child_leaves_the_parents_groups_alone(how, transport):
    (code, sums0, _), (_, sums1, got) = run_ranks(_forking(how), 2, timeout=20, deadline=60,
                                                  env={"ALLREDUCE_TRANSPORT": transport})
    assert code == REFUSED
    assert sums0 == sums1 == [3.0, 3.0]
    assert got == 9.0
