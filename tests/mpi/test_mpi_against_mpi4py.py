"""examples/mpi_every_method.py prints the same digest under real mpi4py and under allreduce.MPI,
launched by ``mpirun``, by ``allreduce run`` and with ``srun``'s variables.

Real MPI comes from scripts/install-mpi.sh; without ``mpirun`` and mpi4py the comparisons with it skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from support.harness import free_port
from support.paths import EXAMPLES, ROOT, SRC

SCRIPT = str(EXAMPLES / "mpi_every_method.py")
RANKS = 3
LAUNCHERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_", "PMI_",
             "SLURM_", "ALLREDUCE_")


def clean_env(**extra) -> dict:
    """This environment without any launcher's variables (the test may itself run under one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHERS)}
    return {**env, "PYTHONPATH": str(SRC), **extra}


def digest_of(cmd: list[str], env: dict | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env or clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def mpirun(*args: str) -> list[str]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", "-n", str(RANKS), *root, "--oversubscribe", *args]


def under_allreduce_run() -> str:
    cmd = [sys.executable, "-m", "allreduce", "run", "-n", str(RANKS), "--no-tag-output", "--", sys.executable, SCRIPT]
    return digest_of(cmd)


def test_allreduce_run_and_srun_variables_give_one_digest():
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, SCRIPT], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True,
                              env=clean_env(SLURM_PROCID=str(r), SLURM_NTASKS=str(RANKS), SLURM_LOCALID=str(r),
                                            SLURM_NTASKS_PER_NODE=str(RANKS), MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=port))
             for r in range(RANKS)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * RANKS, outputs
    assert outputs[0][0] == under_allreduce_run()
    assert outputs[0][0].splitlines()[-1].startswith("digest ")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (scripts/install-mpi.sh installs Open MPI)")
def test_real_mpi4py_and_allreduce_mpi_print_the_same_digest():
    pytest.importorskip("mpi4py", reason="no mpi4py (scripts/install-mpi.sh installs it)")
    theirs = digest_of(mpirun(sys.executable, SCRIPT, "mpi4py"))
    port = str(free_port())
    ours_under_mpirun = digest_of(mpirun("-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", "-x", "PYTHONPATH",
                                         sys.executable, SCRIPT))
    assert ours_under_mpirun == theirs
    assert under_allreduce_run() == theirs
