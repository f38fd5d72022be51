"""Size limits of the product packages: a module holds at most 450 lines and a function body at
most 60 (from its docstring or first statement to its end: a long signature, such as a CLI
command's declared options, does not count). The test lists every offender with its
size; `STILL_OVER` names the ones not yet split (each must still be over: a split one leaves the
list), so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "net", "wal", "health", "sync", "node", "shoal")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60

STILL_OVER: frozenset[str] = frozenset()
"""Offenders not yet split: `path` for a module, `path:qualified.name` for a function."""


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for item in ast.iter_child_nodes(tree):
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{item.name}"
            if not isinstance(item, ast.ClassDef):
                first = item.body[0].lineno
                found.append((name, (item.end_lineno or item.lineno) - first + 1))
            found.extend(_functions(item, f"{name}."))
        else:
            found.extend(_functions(item, prefix))
    return found


def offenders(root: Path = ROOT) -> dict[str, int]:
    """Every module over MAX_MODULE_LINES and function over MAX_FUNCTION_LINES, with its size."""
    over: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8")
            lines = len(text.splitlines())
            if lines > MAX_MODULE_LINES:
                over[relative] = lines
            for name, size in _functions(ast.parse(text, filename=relative)):
                if size > MAX_FUNCTION_LINES:
                    over[f"{relative}:{name}"] = size
    return over


def test_no_module_or_function_over_the_limits() -> None:
    found = offenders()
    new = {name: size for name, size in found.items() if name not in STILL_OVER}
    listing = "\n".join(f"  {name}: {size} lines" for name, size in sorted(new.items()))
    assert not new, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function:\n{listing}"
    )
    split = sorted(STILL_OVER - set(found))
    assert not split, f"no longer over the limits: remove from STILL_OVER: {split}"


def test_the_limits_see_a_long_function_and_a_long_module(tmp_path: Path) -> None:
    package = tmp_path / "node"
    package.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    (package / "long.py").write_text(f"class C:\n    def f(self) -> None:\n{body}\n")
    (package / "short.py").write_text("def g() -> None:\n    pass\n")
    (package / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    found = offenders(tmp_path)
    assert found == {"node/long.py:C.f": MAX_FUNCTION_LINES + 1, "node/big.py": 451}
