"""What a user reads holds: every public name has a docstring, the environment table lists every
variable the code reads, the guides' marked examples run, and the site builds without a warning."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest
from support.paths import ROOT, SRC

import allreduce
from allreduce.cli import variables

DOCS = ROOT / "docs"
RUN_MARK = re.compile(r"<!-- run: (\d+) ranks? -->\n```python\n(.*?)```", re.DOTALL)


def public_objects():
    """``(name, object)`` for every name of ``allreduce.__all__`` and every public method of its classes."""
    for name in allreduce.__all__:
        obj = getattr(allreduce, name)
        yield name, obj
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                    yield f"{name}.{attr}", value


def test_every_public_name_has_a_docstring():
    missing = [name for name, obj in public_objects() if not (inspect.getdoc(obj) or "").strip()]
    assert missing == []


def test_the_public_names_include_the_point_to_point_calls():  # the names a user looks for first
    documented = dict(public_objects())
    for name in ("isend", "irecv", "is_initialized", "Work.wait"):
        assert (inspect.getdoc(documented[name]) or "").strip(), name


def test_the_api_reference_shows_every_public_name():
    shown = set(re.findall(r"^::: allreduce\.(\w+)$", (DOCS / "api.md").read_text(), re.MULTILINE))
    assert set(allreduce.__all__) - shown == set()


def test_the_variable_table_lists_every_variable_the_code_reads():
    read = set()
    for path in SRC.rglob("*.py"):
        read |= set(re.findall(r"\bALLREDUCE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    listed = {name for name, _ in variables.library()}
    assert read - listed == set(), "add these to settings.VARIABLES or allreduce/cli/variables.py"
    assert {"ALLREDUCE_SHM_CROSS_MEMORY", "ALLREDUCE_NPROC", "ALLREDUCE_NNODES", "ALLREDUCE_NODE_RANK",
            "ALLREDUCE_DEBUG"} <= listed
    table = variables.markdown()
    assert all(f"`{name}`" in table for name in listed | {"MASTER_ADDR", "RANK", "SLURM_PROCID"})


def test_every_page_of_the_navigation_exists():
    nav = re.findall(r":\s+([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert {"index.md", "api.md", "cli.md", "environment.md", "performance.md"} <= set(nav)
    assert [page for page in nav if not (DOCS / page).exists()] == []


def marked_examples() -> list[tuple[str, int, str]]:
    """``(page, ranks, code)`` for every ```python block after a ``<!-- run: N ranks -->`` line."""
    return [(page.stem, int(ranks), code) for page in sorted(DOCS.glob("*.md"))
            for ranks, code in RUN_MARK.findall(page.read_text())]


@pytest.mark.parametrize("ranks, code", [pytest.param(r, c, id=f"{p}-{r}") for p, r, c in marked_examples()])
def test_the_marked_examples_of_the_guides_run(ranks, code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    if ranks == 1:
        cmd = [sys.executable, str(script)]
    else:
        cmd = [sys.executable, "-m", "allreduce", "run", "-n", str(ranks), "--", sys.executable, str(script)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_guides_mark_examples_to_run():
    assert {"index", "getting-started", "debugging"} <= {page for page, _, _ in marked_examples()}


@pytest.mark.slow  # ~15 s; `make docs` builds the same way
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_the_site_builds_without_a_warning(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "api" / "index.html").read_text()
    assert all(f'id="allreduce.{name}"' in api for name in ("all_reduce", "isend", "Work", "ReduceOp"))
    assert "ALLREDUCE_SHM_CROSS_MEMORY" in (tmp_path / "environment" / "index.html").read_text()
