"""No shims (issue 35): alias re-exports (`from x import Y as Y`, `import x as x`), modules that
only re-export, and classes that hand-write `__aenter__`/`__aexit__` beside config.AsyncClosing
are counted here, printed, and bounded; each one left is listed with its reason."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["config", "net", "wal", "health", "sync", "node", "shoal"]

# A documented public name may be re-exported under its own name (module: name -> reason).
ALIAS_REEXPORTS: dict[str, str] = {}
MAX_ALIAS_REEXPORTS = 10

# Classes whose `async with` does more than open (or start) and close (module:Class -> reason).
OWN_CONTEXT_MANAGERS = {
    "config.closing:AsyncClosing": "the base class itself",
    "health.breaker:CircuitBreaker": "enters a call through the breaker: admits a ticket and "
    "records the call's outcome on exit, it opens and closes nothing",
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, ast.parse(path.read_text(encoding="utf-8"))


def alias_reexports() -> list[str]:
    """`module: name` for each `from x import Y as Y` and `import x as x` in the packages."""
    found = []
    for module, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    if alias.asname == alias.name:
                        found.append(f"{module}: {alias.asname}")
    return found


def reexport_only_modules() -> list[str]:
    """Modules (not package `__init__`s) whose body is only a docstring, imports and `__all__`."""
    found = []
    for module, tree in _modules():
        if module in PACKAGES or not tree.body:
            continue
        body = [s for s in tree.body if not _is_docstring(s)]
        if body and all(_is_import_or_all(s) for s in body):
            found.append(module)
    return [m for m in found if not (ROOT / m.replace(".", "/") / "__init__.py").exists()]


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _is_import_or_all(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return True
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    if isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    return [ast.unparse(t) for t in targets] == ["__all__"]


def hand_written_context_managers() -> list[str]:
    """`module:Class` for each class that defines `__aenter__` or `__aexit__` itself."""
    found = []
    for module, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = {
                    item.name
                    for item in node.body
                    if isinstance(item, ast.AsyncFunctionDef | ast.FunctionDef)
                }
                if methods & {"__aenter__", "__aexit__"}:
                    found.append(f"{module}:{node.name}")
    return found


def test_alias_reexports_are_few_and_listed() -> None:
    found = alias_reexports()
    print(f"alias re-exports: {len(found)} (at most {MAX_ALIAS_REEXPORTS})")
    assert len(ALIAS_REEXPORTS) <= MAX_ALIAS_REEXPORTS
    unlisted = sorted(set(found) - set(ALIAS_REEXPORTS))
    assert unlisted == [], (
        f"{unlisted}: import the name from the module that defines it instead of re-exporting "
        "it (`from x import Y as Y`), or list it in ALIAS_REEXPORTS with the doc that names it"
    )
    assert sorted(ALIAS_REEXPORTS) == sorted(found), "ALIAS_REEXPORTS lists a re-export gone"


def test_no_module_only_re_exports() -> None:
    found = reexport_only_modules()
    print(f"re-export-only modules: {len(found)}")
    assert found == [], f"{found} only re-export: import from the defining modules and fold them"


def test_async_context_managers_use_async_closing() -> None:
    found = hand_written_context_managers()
    extra = sorted(set(found) - set(OWN_CONTEXT_MANAGERS))
    print(f"hand-written __aenter__/__aexit__: {len(extra)} (+{len(OWN_CONTEXT_MANAGERS)} allowed)")
    assert extra == [], (
        f"{extra} hand-write __aenter__/__aexit__: subclass config.AsyncClosing (override "
        "`_enter` to open or start, `close` to close) or use contextlib, or list the class in "
        "OWN_CONTEXT_MANAGERS with the reason"
    )
    assert sorted(OWN_CONTEXT_MANAGERS) == sorted(set(found) & set(OWN_CONTEXT_MANAGERS))
