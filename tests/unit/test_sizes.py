"""The limits the code keeps to, so that each part can be read in one sitting: no module of ``src/``
over 450 lines, no class over 300, no function or method over 60 (decorators and docstrings counted)."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import SRC

MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 450, 300, 60


def oversized(path: Path, root: Path) -> list[str]:
    """``"file: what (n lines > limit)"`` for the module and each class and function of it over its limit."""
    text = path.read_text()
    where = path.relative_to(root).as_posix()
    found = []
    if len(text.splitlines()) > MODULE_LINES:
        found.append(f"{where}: module ({len(text.splitlines())} lines > {MODULE_LINES})")
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            limit = CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = node.end_lineno - first + 1
            if lines > limit:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                found.append(f"{where}:{node.lineno}: {kind} {node.name} ({lines} lines > {limit})")
    return found


def test_no_module_class_or_function_is_over_its_limit():
    found = [line for path in sorted(SRC.rglob("*.py")) for line in oversized(path, SRC)]
    assert found == [], "over the limits:\n" + "\n".join(found)


def test_the_size_check_names_each_offender(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    (tmp_path / "big.py").write_text(f"class Big:\n    @staticmethod\n    def f():\n{body}\n" + "\n" * 400)
    assert oversized(tmp_path / "big.py", tmp_path) == [
        "big.py: module (463 lines > 450)", "big.py:3: function f (62 lines > 60)"]
