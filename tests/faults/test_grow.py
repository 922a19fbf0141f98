"""``allreduce run -n 3 --min-np 2 --max-np 3`` with the native calls: a worker SIGKILLs itself, the others
shrink and go on; the launcher starts a replacement, which ``join_group`` waits with until the others'
``grow_group`` lets it in; the grown group sums right, the replacement numbered after the members."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from support.paths import SRC

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import allreduce as dist

    if dist.is_replacement():
        dist.join_group()
    else:
        dist.init_process_group()
    first, step, sizes = dist.get_rank(), 0, []   # first: the rank the process began with
    if dist.is_replacement():
        where = [None]
        dist.broadcast_object_list(where)              # the members say which step they are at
        step = where[0]
    while step < 20:
        if first == 1 and step == 3 and not dist.is_replacement():
            os.kill(os.getpid(), signal.SIGKILL)
        while step == 10 and dist.get_world_size() < 3 and "grow" in sys.argv:   # wait for the replacement here
            time.sleep(0.2)
            if dist.grow_group().size == 3:
                dist.broadcast_object_list([step])        # what the replacement learns first
        x = np.full(101, dist.get_rank() + 1, np.int64)
        try:
            dist.all_reduce(x)
        except dist.AllreduceError:
            dist.shrink_group()
            step = int(dist.all_reduce_scalar(step, dist.ReduceOp.MIN))
            continue
        n = dist.get_world_size()
        assert (x == n * (n + 1) // 2).all(), (step, n, x[:3])
        sizes.append(n)
        step += 1
    print(f"done: rank {dist.get_rank()} sizes {sorted(set(sizes))} last {sizes[-1]}", flush=True)
    dist.destroy_process_group()
""")


def _run(tmp_path, *script_args: str):
    script = tmp_path / "grow.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("ALLREDUCE_")}
    done = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "3", "--min-np", "2", "--max-np", "3",
                           "--", sys.executable, str(script), *script_args],
                          env={**env, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=120)
    return done, done.stdout + done.stderr


def test_a_replacement_joins_the_survivors_at_their_grow(tmp_path):
    done, out = _run(tmp_path, "grow")
    assert done.returncode == 0, out
    assert "started a replacement worker [3]" in done.stderr, out
    lines = sorted(line for line in done.stdout.splitlines() if "done:" in line)
    assert lines == ["[0] done: rank 0 sizes [2, 3] last 3", "[2] done: rank 1 sizes [2, 3] last 3",
                     "[3] done: rank 2 sizes [3] last 3"], out


def test_a_replacement_never_let_in_is_stopped_when_the_others_finish(tmp_path):
    done, out = _run(tmp_path)  # the members never call grow_group
    assert done.returncode == 0, out
    assert "the others finished before 1 replacement worker(s) could join; stopping them" in done.stderr, out
    assert sorted(line for line in done.stdout.splitlines() if "done:" in line) == [
        "[0] done: rank 0 sizes [2, 3] last 2", "[2] done: rank 1 sizes [2, 3] last 2"], out
