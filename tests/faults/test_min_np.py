"""``allreduce run -n 4 --min-np M``: a worker SIGKILLs itself mid-loop; the launcher lets the others go on while at
least M live, they shrink and finish, and the job exits 0. Without room to go on, the job stops as before. With
``--max-np 4`` the launcher starts a replacement, which ``join_group`` keeps waiting until the others' ``grow_group``
lets it in (numbered after them), or which the launcher stops if they finish first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support.paths import SRC

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import allreduce as dist

    if dist.is_replacement():                 # started by --max-np in the dead worker's place
        dist.join_group()
        where = [None]
        dist.broadcast_object_list(where)     # the others say which step they are at
        step = where[0]
    else:
        dist.init_process_group()
        step = 0
    me = dist.get_rank()
    while step < 20:
        if me == 2 and step == 5 and not dist.is_replacement():
            os.kill(os.getpid(), signal.SIGKILL)
        while "grow" in sys.argv and step == 10 and dist.get_world_size() < 4:   # wait for the replacement
            time.sleep(0.2)
            if dist.grow_group().size == 4:
                dist.broadcast_object_list([step])
        x = np.full(100, me + 1, np.int64)
        try:
            dist.all_reduce(x)
        except dist.AllreduceError:
            dist.shrink_group()
            step = int(dist.all_reduce_scalar(step, dist.ReduceOp.MIN))
            continue
        step += 1
    print(f"done: size {dist.get_world_size()} sum {int(x[0])}", flush=True)
    dist.destroy_process_group()
""")


def _run(tmp_path, *flags, script_args=()):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("ALLREDUCE_")}
    command = [sys.executable, "-m", "allreduce", "run", "-n", "4", *flags, "--", sys.executable, str(script),
               *script_args]
    return subprocess.run(command, env={**env, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=120)


def _done(run) -> list[str]:
    return sorted(line for line in run.stdout.splitlines() if "done:" in line)


def test_the_others_go_on_while_enough_live(tmp_path):
    done = _run(tmp_path, "--min-np", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _done(done) == [f"[{r}] done: size 3 sum 7" for r in (0, 1, 3)], done.stdout
    assert "rank 2 was killed by SIGKILL" in done.stderr and "go on (--min-np 2)" in done.stderr, done.stderr


@pytest.mark.parametrize("flags", [(), ("--min-np", "4")])
def test_without_room_one_failure_stops_the_job(tmp_path, flags):
    done = _run(tmp_path, *flags)
    assert done.returncode == 128 + 9, done.stdout + done.stderr
    assert "stopping the other 3 worker(s)" in done.stderr, done.stderr


def test_a_replacement_joins_the_others_at_their_grow(tmp_path):
    done = _run(tmp_path, "--min-np", "2", "--max-np", "4", script_args=("grow",))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started a replacement worker [4]" in done.stderr, done.stderr
    # ranks 0, 1, 3 add 1 + 2 + 4; the replacement, rank 3 of the grown group, adds 4
    assert _done(done) == [f"[{r}] done: size 4 sum 11" for r in (0, 1, 3, 4)], done.stdout + done.stderr


def test_a_replacement_never_let_in_is_stopped_when_the_others_finish(tmp_path):
    done = _run(tmp_path, "--min-np", "2", "--max-np", "4")  # the others never call grow_group
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the others finished before 1 replacement worker(s) could join; stopping them" in done.stderr, done.stderr
    assert _done(done) == [f"[{r}] done: size 3 sum 7" for r in (0, 1, 3)], done.stdout
