"""``allreduce run -n 4 --min-np M``: a worker SIGKILLs itself mid-loop; the launcher lets the others go on while at
least M live, they shrink and finish, and the job exits 0. Without room to go on, the job stops as before."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support.paths import SRC

SCRIPT = textwrap.dedent("""
    import os, signal
    import numpy as np
    import allreduce as dist

    dist.init_process_group()
    me, step = dist.get_rank(), 0
    while step < 20:
        if me == 2 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
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


def _run(tmp_path, *flags):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("ALLREDUCE_")}
    return subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "4", *flags, "--", sys.executable, str(script)],
                          env={**env, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=120)


def test_the_others_go_on_while_enough_live(tmp_path):
    done = _run(tmp_path, "--min-np", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line for line in done.stdout.splitlines() if "done:" in line) == [
        f"[{r}] done: size 3 sum 7" for r in (0, 1, 3)], done.stdout
    assert "rank 2 was killed by SIGKILL" in done.stderr and "go on (--min-np 2)" in done.stderr, done.stderr


@pytest.mark.parametrize("flags", [(), ("--min-np", "4")])
def test_without_room_one_failure_stops_the_job(tmp_path, flags):
    done = _run(tmp_path, *flags)
    assert done.returncode == 128 + 9, done.stdout + done.stderr
    assert "stopping the other 3 worker(s)" in done.stderr, done.stderr
