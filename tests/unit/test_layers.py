"""The layer table of docs/design.md holds: lint-imports checks the layers contract in pyproject.toml,
``import allreduce`` loads no command-line code, and no private name crosses a module boundary."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

import pytest
from support.paths import ROOT, SRC


def test_the_layers_contract_is_kept():
    lint = shutil.which("lint-imports", path=str(__import__("pathlib").Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (the dev extra installs it)")
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_importing_the_library_loads_no_command_line_code():
    probe = ("import sys, allreduce; "
             "print(' '.join(m for m in sys.modules if m == 'argparse' or m.startswith('allreduce.cli')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def private_names_used_across_modules(path) -> list[str]:
    """``from m import _x`` and ``m._x`` where ``m`` is one of the package's modules, in one file."""
    tree = ast.parse(path.read_text(), str(path))
    modules: set[str] = set()  # local names bound to allreduce modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            ours = node.level > 0 or (node.module or "").startswith("allreduce")
            for alias in node.names:
                if ours and alias.name.startswith("_") and not alias.name.startswith("__"):
                    source = f"{'.' * node.level}{node.module or ''}"
                    found.append(f"{path.name}:{node.lineno}: from {source} import {alias.name}")
                if ours:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("allreduce"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module_boundary():
    found = [line for path in sorted((SRC / "allreduce").rglob("*.py"))
             for line in private_names_used_across_modules(path)]
    assert found == []


def test_the_private_name_check_catches_both_forms(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from allreduce import api\nfrom .runtime import _confirmed\nimport allreduce.api as a\n"
                      "api._State\na._leave\nself._own\n")
    assert private_names_used_across_modules(sample) == [
        "sample.py:2: from .runtime import _confirmed", "sample.py:4: api._State", "sample.py:5: a._leave"]
