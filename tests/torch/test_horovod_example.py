"""examples/horovod_mnist.py, a Horovod script whose only change is its import line, trains under
``allreduce run`` on 2 and 3 ranks: the loss goes down and the ranks agree on the averaged metrics."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from support.paths import EXAMPLES

pytest.importorskip("torch")  # an optional extra: pip install 'allreduce[torch]'

EXAMPLE = EXAMPLES / "horovod_mnist.py"
EPOCH = re.compile(r"epoch (\d)/2  train loss (\d+\.\d+)  test loss (\d+\.\d+)  accuracy (\d+\.\d+)%  samples/s (\d+)")


def test_the_import_line_is_the_only_change_from_horovod():
    tree = ast.parse(EXAMPLE.read_text())
    ours = [(alias.name, alias.asname) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names if "allreduce" in (getattr(node, "module", None) or alias.name)]
    assert ours == [("allreduce.torch", "hvd")]
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "allreduce"]


@pytest.mark.parametrize("ranks, options", [
    (2, ["--fp16-allreduce"]),
    pytest.param(3, ["--use-adasum"], marks=pytest.mark.slow),
])
def test_it_trains_under_allreduce_run(ranks, options):
    cmd = [sys.executable, "-m", "allreduce", "run", "-n", str(ranks), "--", sys.executable, str(EXAMPLE),
           "--epochs", "2", "--train-samples", "1536", "--test-samples", "300", "--log-interval", "1000", *options]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = EPOCH.findall(done.stdout)
    assert [e[0] for e in epochs] == ["1", "2"], done.stdout
    assert float(epochs[1][1]) < float(epochs[0][1]) and float(epochs[1][2]) < float(epochs[0][2])  # it learns
