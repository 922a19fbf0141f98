"""Open MPI's ``mpirun`` starts the ranks; ``init_process_group()`` needs nothing exported.

Skipped without ``mpirun`` (scripts/install-mpi.sh installs Open MPI).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys

import pytest
from deployment import CHECK, assert_job, clean_env, run_all

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (scripts/install-mpi.sh)")


def mpirun(ranks: int, *options: str) -> list[str]:
    """``mpirun -n RANKS``, with what Open MPI itself needs here: root's consent, more ranks than cores."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", "-n", str(ranks), *root, "--oversubscribe", *options, sys.executable, CHECK]


def test_two_jobs_at_once_meet_at_ports_of_their_own():
    """Two jobs side by side: each derives its store's port from its own job, so neither meets the other."""
    for output in run_all([mpirun(2)] * 2, [clean_env()] * 2):
        assert_job(output, 2, "openmpi", [[0, 1]])


@pytest.mark.slow
def test_mpijob_launcher_command(tmp_path):
    """A Kubernetes MPIJob's launcher: mpirun over the host file, rank 0's host and the secret passed on."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=4\n")
    first = hostfile.read_text().split()[0]
    env = clean_env(ALLREDUCE_SECRET=secrets.token_hex(16))
    command = mpirun(4, "--hostfile", str(hostfile), "-x", f"MASTER_ADDR={first}", "-x", "ALLREDUCE_SECRET")
    assert_job(run_all([command], [env])[0], 4, "openmpi", [[0, 1, 2, 3]])
