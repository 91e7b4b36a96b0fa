"""The package's imports: no cycle among its modules (imports inside functions count), and every module
imports on its own.

A cycle held together by a function-level import works until someone moves that import to the top, or
imports the modules in another order; so the graph is read from the source with `ast`, every import
statement wherever it stands (only `if TYPE_CHECKING:` blocks, which never run, are left out).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = "llama_rpc_deploy"
ROOT = Path(__file__).resolve().parents[2]


def package_modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package as it is on disk now: dotted name -> file."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """(imported name, line, enclosing function or None) for every import statement of one module."""

    def __init__(self, module: str, is_package: bool):
        self.package = module.split(".") if is_package else module.split(".")[:-1]
        self.found: list[tuple[list[str], int, str | None]] = []
        self.function: list[str] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        self.function.append(node.name)
        self.generic_visit(node)
        self.function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _add(self, candidates: list[str], node: ast.stmt) -> None:
        self.found.append((candidates, node.lineno, self.function[-1] if self.function else None))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add([alias.name], node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package[: len(self.package) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:  # `from M import X`: the submodule M.X when there is one, else M
            self._add([f"{module}.{alias.name}", module], node)


def import_graph(modules: dict[str, Path], root: Path = ROOT) -> dict[str, dict[str, str]]:
    """module -> {module of the package it imports: where (file:line, and the function for a lazy import)}."""
    graph: dict[str, dict[str, str]] = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        edges = graph.setdefault(name, {})
        for candidates, line, function in visitor.found:
            target = next((c for c in candidates if c in modules), None)
            if target is None:  # `import a.b.c`: the deepest module of the package on that path
                parts = candidates[-1].split(".")
                target = next(
                    (".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None
                )
            if target and target != name:
                where = f"{path.relative_to(root)}:{line}" + (f" (inside {function}())" if function else "")
                edges.setdefault(target, where)
    return graph


def tangles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (the strongly connected components
    of more than one module, by Tarjan's algorithm), each sorted; [] when the graph has no cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, {})):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = [stack.pop()]
            while members[-1] != node:
                members.append(stack.pop())
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def shortest_cycle(members: list[str], graph: dict[str, dict[str, str]]) -> list[str]:
    """A shortest cycle [a, b, ..., a] through the first of members (a tangle), breadth first within it."""
    start = members[0]
    came_from: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        for target in sorted(graph[node]):
            if target == start:
                cycle = [node]
                while (previous := came_from[cycle[-1]]) is not None:
                    cycle.append(previous)
                return cycle[::-1] + [start]
            if target in members and target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise ValueError(f"{members} is no tangle of the graph")


def describe(members: list[str], graph: dict[str, dict[str, str]]) -> str:
    """The tangle's modules, a cycle through them, then the other imports among them."""
    cycle = shortest_cycle(members, graph)
    steps = list(zip(cycle, cycle[1:]))
    others = [(a, b) for a in members for b in sorted(graph[a]) if b in members and (a, b) not in steps]
    return "\n".join(
        [f"{', '.join(members)}: a cycle"]
        + [f"  {a} -> {b}   {graph[a][b]}" for a, b in steps]
        + (["  and among them also"] if others else [])
        + [f"  {a} -> {b}   {graph[a][b]}" for a, b in others]
    )


def test_the_package_has_no_import_cycle():
    modules = package_modules()
    assert f"{PACKAGE}.cluster" in modules  # the walk found the package
    graph = import_graph(modules)
    found = tangles(graph)
    assert not found, f"modules of {PACKAGE} that import each other (imports inside functions count):\n" + "\n".join(
        describe(members, graph) for members in found
    )


def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path):
    """The check itself: a cycle closed only by an import inside a function, with relative imports."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("import os\nfrom .. import c\n")
    (pkg / "c.py").write_text("def f():\n    from .a import x\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    graph = import_graph(package_modules(tmp_path, "pkg"), tmp_path)
    assert graph["pkg.d"] == {}
    assert tangles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert shortest_cycle(["pkg.a", "pkg.c", "pkg.sub.b"], graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    assert graph["pkg.c"] == {"pkg.a": "pkg/c.py:2 (inside f())"}
    (pkg / "c.py").write_text("")
    assert tangles(import_graph(package_modules(tmp_path, "pkg"), tmp_path)) == []


# One process for every module: each import starts from no module of the package loaded (the third-party
# ones stay, so the whole loop costs about one import of everything). It also says which modules brought in the
# checkout's lab/ or matplotlib (the `plot` extra): the installed package holds the product only.
ISOLATED_IMPORTS = f"""
import importlib, sys, traceback
failed, outside = [], []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.startswith({PACKAGE!r})]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failed.append(f"{{name}}:\\n{{traceback.format_exc()}}")
    brought = sorted(m for m in sys.modules if m.split(".")[0] in ("lab", "matplotlib"))
    if brought:
        outside.append(f"{{name}} imports {{', '.join(brought[:3])}}")
        for m in brought:
            del sys.modules[m]
print("\\n".join(failed + outside))
sys.exit(1 if failed or outside else 0)
"""


def test_every_module_imports_on_its_own_and_none_brings_in_the_lab_or_matplotlib():
    names = sorted(package_modules())
    assert {"llama_rpc_deploy.__main__", "llama_rpc_deploy.bench"} <= set(names)
    done = subprocess.run(
        [sys.executable, "-c", ISOLATED_IMPORTS, *names], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (
        f"these modules fail to import on their own, or import lab/matplotlib:\n{done.stdout}{done.stderr}"
    )
