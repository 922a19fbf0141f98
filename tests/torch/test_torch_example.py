"""examples/train.py runs under the launcher and reports loss and throughput per epoch."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from support.paths import EXAMPLES

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

EXAMPLE = EXAMPLES / "train.py"


def test_the_training_example_runs_under_allreduce_run():
    cmd = [sys.executable, "-m", "allreduce", "run", "-n", "2", "--", sys.executable, str(EXAMPLE),
           "--epochs", "2", "--samples", "1024", "--hidden", "32", "--compression", "fp16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = re.findall(r"epoch (\d)/2  loss (\d+\.\d+)  samples/s (\d+)", done.stdout)
    assert [e[0] for e in epochs] == ["1", "2"], done.stdout
    assert float(epochs[1][1]) < float(epochs[0][1])  # it learns
