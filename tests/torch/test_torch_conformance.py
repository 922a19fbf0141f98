"""CI's share of torch's own distributed test base on "allreduce" (``distributed_test_driver.py``):
one test of each kind of call torch makes of a backend, world size 2. ``make torch-conformance``
runs the whole base."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it

from support.paths import ROOT

DRIVER = ROOT / "tests" / "torch" / "distributed_test_driver.py"


def selection() -> list[str]:
    """The driver's CI_SELECTION, read without importing it (importing it sets torch's test variables)."""
    source = DRIVER.read_text()
    block = source[source.index("CI_SELECTION = ["):]
    return re.findall(r'"(test_\w+)"', block[:block.index("]")])


def test_the_ci_selection_of_torchs_distributed_tests_passes():
    chosen = selection()
    tests = [f"{DRIVER}::TestDistBackendWithSpawn::{name}" for name in chosen]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT,
                          env={**os.environ, "BACKEND_UNDER_TEST": "allreduce", "WORLD_SIZE": "2",
                               "CONFORMANCE_START": "fork"})
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert f"{len(chosen)} passed" in summary, summary
