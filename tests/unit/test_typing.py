"""The package is typed: it ships ``py.typed``, and ``mypy --strict`` passes on its public modules
(configured in pyproject.toml), so a user's type checker sees the real signatures, not ``Any``."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys

import pytest
from support.paths import ROOT, SRC

import allreduce


def test_the_package_says_it_is_typed():
    assert (SRC / "allreduce" / "py.typed").exists()
    assert '"allreduce" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def test_the_collectives_annotate_tensor_op_and_group():
    for name in ("all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "send"):
        parameters = inspect.signature(getattr(allreduce, name)).parameters
        assert parameters["group"].annotation == "Group", name
        assert all(p.annotation is not inspect.Parameter.empty for p in parameters.values()), name
    assert inspect.signature(allreduce.all_reduce).parameters["tensor"].annotation == "Tensor"
    assert inspect.signature(allreduce.all_reduce).return_annotation == "Work | None"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (the dev extra has it)")
def test_mypy_strict_passes_on_the_public_modules():
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
