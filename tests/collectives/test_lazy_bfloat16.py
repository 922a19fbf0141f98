"""``ml_dtypes`` (most of a second of CPU to import) is loaded only by a rank that uses bfloat16: fresh
processes (a job under the launcher, a group of one, the MPI face imported) all-reduce float32 without it,
then load it through ``allreduce.dtypes`` and all-reduce bfloat16 as before."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import engines
from support.harness import free_port
from support.paths import SRC

pytestmark = engines.BOTH

SCRIPT = """
import sys
import numpy as np
import allreduce as dist
from allreduce import MPI, dtypes

dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
total = size * (size + 1) // 2  # the sum of every rank's rank + 1
x = np.full(5, rank + 1, dtype=np.float32)
dist.all_reduce(x)
assert x.tolist() == [total] * 5, x
assert "ml_dtypes" not in sys.modules, "a float32 job imported ml_dtypes"
if sys.argv[1] == "bfloat16":
    y = dist.empty(5, "bfloat16")  # the name alone loads ml_dtypes
    y[:] = np.arange(5) * (rank + 1)
    dist.all_reduce(y)
    assert "ml_dtypes" in sys.modules and y.dtype == dtypes.bfloat16
    assert y.astype(np.float32).tolist() == [total * i for i in range(5)], y
    assert dtypes.code_of(y.dtype) == 15 and dtypes.dtype_of(15) == y.dtype and y.dtype in dtypes.SUPPORTED
    assert MPI.BFLOAT16_T.dtype == y.dtype and MPI.BFLOAT16_T.Get_size() == 2
dist.destroy_process_group()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLREDUCE_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {**env, "PYTHONPATH": str(SRC), "ALLREDUCE_ENGINE": os.environ["ALLREDUCE_ENGINE"]}


@pytest.mark.parametrize("use", ["float32", "bfloat16"])
def test_ml_dtypes_is_imported_only_by_a_job_that_uses_bfloat16(use):
    done = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "2", "--", sys.executable, "-c", SCRIPT,
                           use], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("use", ["float32", "bfloat16"])
def test_a_group_of_one_imports_ml_dtypes_only_for_bfloat16(use):
    env = {**_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, "-c", SCRIPT, use], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_profile_tuned_with_bfloat16_loads_in_a_fresh_process():
    script = ("from allreduce.planner import costmodel\n"
              "assert ('bfloat16', 1e-9) in costmodel.from_json({'gamma': {'bfloat16': 1e-9}}).gamma\n")
    done = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
