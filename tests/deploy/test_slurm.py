"""Jobs under a real Slurm: ``srun`` and ``sbatch`` with nothing exported but the job itself.

Needs a running Slurm with an idle node (``make slurm`` starts a single-node one); skipped otherwise.
The 4-rank and sbatch jobs are slow (``make deploy-test`` runs them).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from deployment import CHECK, assert_job, clean_env
from support.paths import EXAMPLES, ROOT

DEADLINE_S = 180


def _slurm_is_up() -> bool:
    if not all(shutil.which(tool) for tool in ("srun", "sinfo", "scontrol")):
        return False
    try:  # `scontrol ping` answers at once when slurmctld is down; sinfo would retry for seconds
        if subprocess.run(["scontrol", "ping"], capture_output=True, timeout=10).returncode:
            return False
        states = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(state.startswith(("idle", "mix")) for state in states.split())


pytestmark = pytest.mark.skipif(not _slurm_is_up(), reason="no running Slurm with an idle node (make slurm)")


@pytest.mark.parametrize("tasks", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_srun_needs_no_settings(tasks):
    done = subprocess.run(["srun", "-n", str(tasks), sys.executable, CHECK], env=clean_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_job(done.stdout, tasks, "slurm", [list(range(tasks))])


@pytest.mark.slow
def test_sbatch_script_of_the_docs(tmp_path):
    out = tmp_path / "job.out"
    done = subprocess.run(["sbatch", "--wait", f"--output={out}", str(EXAMPLES / "slurm_job.sbatch")],
                          env=clean_env(PYTHON=sys.executable), cwd=ROOT, capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert done.returncode == 0, done.stdout + done.stderr + (out.read_text() if out.exists() else "")
    assert_job(out.read_text(), 4, "slurm", [[0, 1, 2, 3]])
