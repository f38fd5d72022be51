"""Imports flow one way (config <- net <- wal <- health <- sync <- node); none imports a higher
layer, no module-level import cycle joins two of our modules, and every module imports on its
own."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

LAYERS = ["config", "net", "wal", "health", "sync", "node"]
ROOT = Path(__file__).resolve().parent.parent


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", LAYERS)
def test_no_upward_import_in_source(package: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    forbidden = set(LAYERS) - allowed
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _imported_top_levels(path) & forbidden
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, f"{package} may import only {sorted(allowed)}: {offenders}"


@pytest.mark.parametrize("package", LAYERS)
def test_package_imports_alone_without_higher_layers(package: str) -> None:
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"pkg = importlib.import_module({package!r})\n"
        "for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "    if not info.name.endswith('__main__'):\n"
        "        importlib.import_module(info.name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {LAYERS!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"importing {package} alone failed:\n{result.stderr}"
    loaded = {name.split(".")[0] for name in json.loads(result.stdout.strip().splitlines()[-1])}
    higher = loaded - set(LAYERS[: LAYERS.index(package) + 1])
    assert not higher, f"importing {package} pulled in higher layers {sorted(higher)}"


@pytest.mark.parametrize("package", LAYERS)
def test_public_names_are_exported(package: str) -> None:
    module = __import__(package)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list)
    for name in exported:
        assert hasattr(module, name), f"{package}.__all__ lists {name} but it is not defined"


# --- module-level import cycles ----------------------------------------------------------------


def module_name(path: Path, root: Path) -> str:
    """`sync/records/types.py` -> `sync.records.types`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(root: Path, packages: list[str]) -> dict[str, Path]:
    """Every module and package of `packages` below `root`, by dotted name."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def module_level_imports(
    tree: ast.Module, *, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: at top level, in class bodies and
    in try/with/if blocks, but not in functions; those under `if TYPE_CHECKING:` only when
    `type_checking`."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        statement = pending.pop(0)
        if isinstance(statement, ast.Import | ast.ImportFrom):
            yield statement
        elif isinstance(statement, ast.If):
            if type_checking or not _is_type_checking(statement.test):
                pending.extend(statement.body)
            pending.extend(statement.orelse)
        elif isinstance(statement, ast.Try | ast.TryStar):
            pending.extend(statement.body)
            pending.extend(statement.orelse)
            pending.extend(statement.finalbody)
            for handler in statement.handlers:
                pending.extend(handler.body)
        elif isinstance(statement, ast.With | ast.ClassDef):
            pending.extend(statement.body)


def _resolve(
    statement: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: set[str]
) -> Iterator[str]:
    """The modules of `known` that `statement` (in module `importer`) loads by name."""
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.name in known:
                yield alias.name
        return
    base = statement.module or ""
    if statement.level:
        anchor = importer.split(".") if is_package else importer.split(".")[:-1]
        anchor = anchor[: len(anchor) - (statement.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    for alias in statement.names:
        candidate = f"{base}.{alias.name}"
        if candidate in known:
            yield candidate  # `from pkg import module`
        elif base in known:
            yield base  # `from module import name`


def import_graph(
    root: Path, packages: list[str], *, type_checking: bool = False
) -> dict[str, dict[str, int]]:
    """module -> {module it imports at module level: line of the first such import}; with
    `type_checking`, the imports under `if TYPE_CHECKING:` count too."""
    modules = source_modules(root, packages)
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: dict[str, int] = {}
        for statement in module_level_imports(tree, type_checking=type_checking):
            for target in _resolve(statement, name, path.name == "__init__.py", known):
                if target != name:
                    edges.setdefault(target, statement.lineno)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle through each group of mutually importing modules (strongly connected
    components of more than one module, Tarjan's algorithm), each starting at its least name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, {})):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_shortest_cycle(graph, component) for component in components)


def _shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """The shortest path from the component's first module back to itself inside it."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target not in members:
                    continue
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # a component has one


def describe_cycle(graph: dict[str, dict[str, int]], cycle: list[str], root: Path) -> str:
    """`a (a.py:3) -> b (b.py:7) -> a`: each module with the line that imports the next."""
    steps = []
    for here, there in itertools.pairwise(cycle):
        path = source_modules(root, [here.split(".")[0]])[here].relative_to(root)
        steps.append(f"{here} ({path}:{graph[here][there]})")
    return " -> ".join([*steps, cycle[-1]])


def test_no_module_level_import_cycle() -> None:
    graph = import_graph(ROOT, LAYERS)
    cycles = [describe_cycle(graph, cycle, ROOT) for cycle in import_cycles(graph)]
    assert not cycles, (
        f"{len(cycles)} module-level import cycle(s); break each by moving the shared name "
        "into a lower module, or import it under `if TYPE_CHECKING:` when only types need it:\n"
        + "\n".join(cycles)
    )


def test_no_import_cycle_hidden_under_type_checking() -> None:
    """An import moved under `if TYPE_CHECKING:` only to dodge a cycle still ties the two modules
    together (one concept spread over both): the shared type belongs in a lower module."""
    graph = import_graph(ROOT, LAYERS, type_checking=True)
    cycles = [describe_cycle(graph, cycle, ROOT) for cycle in import_cycles(graph)]
    assert not cycles, (
        f"{len(cycles)} import cycle(s) through `if TYPE_CHECKING:` imports; move the type they "
        "share into a module both can import, or merge the two halves of the concept:\n"
        + "\n".join(cycles)
    )


def test_cycle_finder_sees_a_cycle_and_ignores_type_checking_and_function_imports(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import B\nA = 1\n")
    (package / "b.py").write_text("from . import c\nB = 2\n")
    (package / "c.py").write_text("try:\n    from pkg.a import A\nexcept ImportError:\n    pass\n")
    (package / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import E\n"
        "def late() -> None:\n    from pkg.e import E\n"
    )
    (package / "e.py").write_text("from pkg.d import late\nE = 3\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.b"] == {"pkg.c": 1}
    assert graph["pkg.d"] == {}
    strict = import_graph(tmp_path, ["pkg"], type_checking=True)
    assert strict["pkg.d"] == {"pkg.e": 3}
    assert ["pkg.d", "pkg.e", "pkg.d"] in import_cycles(strict)
    cycles = import_cycles(graph)
    assert cycles == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert describe_cycle(graph, cycles[0], tmp_path) == (
        "pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:1) -> pkg.c (pkg/c.py:2) -> pkg.a"
    )


# --- every module imports alone ----------------------------------------------------------------


def _importable_modules() -> list[str]:
    return [name for name in source_modules(ROOT, LAYERS) if not name.endswith("__main__")]


@pytest.mark.parametrize("module", _importable_modules())
def test_module_imports_alone_in_a_fresh_interpreter(module: str) -> None:
    """Each module imported first, in its own interpreter: a hidden dependency on import order
    (a cycle that only works from one side, a name set up by a module imported earlier) fails."""
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, (
        f"`import {module}` in a fresh interpreter failed:\n{result.stderr.strip()}"
    )
