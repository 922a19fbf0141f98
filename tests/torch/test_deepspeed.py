"""DeepSpeed on the "allreduce" backend: ZeRO stages 1, 2 and 3 with DeepSpeedCPUAdam train to the same
bits as on Gloo (two ranks under ``allreduce run``; tests/torch/deepspeed_worker.py is one rank).

DeepSpeed compiles its CPU ops (the shared-memory communication op and CPU Adam) on first use, a few
minutes on two cores; ``TORCH_EXTENSIONS_DIR`` keeps them for later runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")  # an optional extra: pip install 'allreduce[deepspeed]'

import numpy as np

WORKER = Path(__file__).with_name("deepspeed_worker.py")
BACKENDS = ("allreduce", "gloo")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, np.lib.npyio.NpzFile]:
    """Every stage's final parameters on each backend, the two jobs run side by side."""
    out = tmp_path_factory.mktemp("deepspeed")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    before = set(os.listdir("/dev/shm"))
    try:
        return _train(out, env)
    finally:  # DeepSpeed's shared-memory op leaves its buffers in /dev/shm when its ranks exit
        for name in set(os.listdir("/dev/shm")) - before:
            if name.startswith("deepspeed_"):
                os.unlink(f"/dev/shm/{name}")


def _train(out: Path, env: dict[str, str]) -> dict[str, np.lib.npyio.NpzFile]:
    jobs = {backend: subprocess.Popen(
        [sys.executable, "-m", "allreduce", "run", "-n", "2", "--",
         sys.executable, str(WORKER), backend, str(out / f"{backend}.npz")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for backend in BACKENDS}
    for backend, job in jobs.items():
        said, _ = job.communicate(timeout=900)
        assert job.returncode == 0, f"{backend}:\n{said[-4000:]}"
    return {backend: np.load(out / f"{backend}.npz") for backend in BACKENDS}


@pytest.mark.timeout(1200)  # the first run compiles DeepSpeed's CPU ops inside the fixture
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_with_cpu_adam_trains_to_the_same_bits_as_gloo(trained, stage):
    ours, gloo = trained["allreduce"], trained["gloo"]
    names = [name for name in gloo.files if name.startswith(f"{stage}.")]
    assert len(names) == 4  # two layers' weights and biases
    for name in names:
        assert np.array_equal(ours[name], gloo[name]), name
