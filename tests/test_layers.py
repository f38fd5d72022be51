"""Imports flow one way (config <- wal <- health <- sync <- node); none imports a higher layer."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

LAYERS = ["config", "wal", "health", "sync", "node"]
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
