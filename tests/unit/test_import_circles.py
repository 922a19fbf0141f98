"""No import circle in ``src/allreduce``: the modules form a graph without cycles, counting every import
(those inside functions too, which hide a circle from the interpreter but not from a reader)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from support.paths import SRC


def module_files(root: Path) -> dict[str, Path]:
    """``{dotted name: file}`` for every module of the package at ``root`` (a package by its ``__init__``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its file.

    A relative import is resolved against the module's package; ``from pkg import x`` imports the
    module ``pkg.x`` when there is one, else ``pkg`` itself (``x`` is a name defined there).
    """
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            within = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join(within + ([node.module] if node.module else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return {target for target in found if target in modules and target != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle per group of modules that import each other (a strongly connected component), as
    ``[a, b, ..., a]`` from the group's first module by name."""
    order, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = {v}
            while stack[-1] != v:
                group.add(stack.pop())
            stack.pop()
            on_stack.difference_update(group)
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return [shortest_circle(graph, group) for group in groups]


def shortest_circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    start = min(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:  # breadth first within the group, back to start
        v = queue.popleft()
        for w in sorted(graph[v] & group):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def test_no_module_of_the_package_imports_itself_through_others():
    graph = import_graph(SRC / "allreduce")
    found = [" -> ".join(circle) for circle in circles(graph)]
    assert found == [], "import circles:\n" + "\n".join(found)


def test_the_circle_check_sees_relative_and_function_level_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from ..c import thing\n")
    (package / "c.py").write_text("import pkg.a\nthing = 1\n")
    (package / "d.py").write_text("from . import c\n")
    assert circles(import_graph(package)) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
