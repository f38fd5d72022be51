"""Light imports: a package's public names load lazily (PEP 562), so `import node.errors` (what a
training process does) loads neither the daemon, nor zeroconf, nor aiohttp, nor pydantic; and
a package's `if TYPE_CHECKING:` imports are its one export list."""

from __future__ import annotations

import ast
import importlib
import json
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from config.lazy import lazy_exports, type_checking_imports

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["config", "net", "wal", "health", "sync", "node"]
HEAVY = ("node.daemon", "zeroconf", "aiohttp", "aiohttp.web", "pydantic", "torch", "yaml")
# `import node.errors` may load this many modules beyond a bare interpreter's (it loads ~70:
# dataclasses, json, the node and config packages, config.errors and config.wire)
NODE_ERRORS_EXTRA_MODULES = 120


def _loaded_after(code: str) -> list[str]:
    """The modules loaded after running `code` in a fresh interpreter of this tree."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_node_errors_loads_no_heavy_module() -> None:
    bare = set(_loaded_after("pass"))
    loaded = set(_loaded_after("import node.errors"))
    heavy = sorted(name for name in loaded if name.split(".")[0] in HEAVY or name in HEAVY)
    assert heavy == [], f"import node.errors loaded {heavy}"
    ours = sorted(name for name in loaded if name.split(".")[0] in LAYERS)
    assert ours == [
        "config",
        "config.errors",
        "config.lazy",
        "config.wire",
        "net",
        "net.errors",
        "node",
        "node.errors",
    ]
    extra = loaded - bare
    assert len(extra) <= NODE_ERRORS_EXTRA_MODULES, sorted(extra)


def test_importing_a_package_loads_none_of_its_modules() -> None:
    loaded = _loaded_after("import config, net, wal, health, sync, node")
    ours = sorted(name for name in loaded if name.split(".")[0] in LAYERS)
    assert ours == ["config", "config.lazy", "health", "net", "node", "sync", "wal"]


def test_cluster_monitor_json_once_loads_no_view_and_no_upper_layer() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the monitor asks it
    argv = ["--json", "--once", "--node", f"http://127.0.0.1:{port}", "--timeout", "1"]
    code = (
        "import os; os.environ.pop('SHOAL_CONFIG', None)\n"
        "from health.cluster_monitor import main\n"
        f"assert main({argv!r}) == 1\n"
    )
    loaded = _loaded_after(code)
    unwanted = ("rich", "node", "sync", "wal", "zeroconf", "torch", "typer", "yaml")
    assert sorted(m for m in loaded if m.split(".")[0] in unwanted) == []
    assert "config.inventory" not in loaded  # no --inventory: no inventory models


def _lazy_packages() -> list[Path]:
    return sorted(
        path
        for layer in LAYERS
        for path in (ROOT / layer).rglob("__init__.py")
        if "lazy_exports(" in path.read_text(encoding="utf-8")
    )


def _package(path: Path) -> str:
    return ".".join(path.parent.relative_to(ROOT).parts)


def test_the_packages_that_export_names_do_so_lazily() -> None:
    """Every package `__init__` with an `__all__` of its own names is lazy (node.cli's is the
    light command table's)."""
    eager = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("__init__.py")):
            source = path.read_text(encoding="utf-8")
            if "__all__" in source and "lazy_exports(" not in source:
                eager.append(_package(path))
    assert eager == ["node.cli"]
    assert len(_lazy_packages()) >= 12


def _checked_imports(path: Path) -> dict[str, list[str]]:
    """The `if TYPE_CHECKING:` imports of a package `__init__`, read by the ast."""
    checked: dict[str, list[str]] = {}
    for statement in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(statement, ast.If) and ast.unparse(statement.test) == "TYPE_CHECKING":
            for imported in statement.body:
                assert isinstance(imported, ast.ImportFrom)
                assert imported.module is not None
                assert all(a.asname is None for a in imported.names)
                checked.setdefault(imported.module, []).extend(a.name for a in imported.names)
    return checked


@pytest.mark.parametrize("path", _lazy_packages(), ids=_package)
def test_one_export_list_per_package(path: Path) -> None:
    """The `if TYPE_CHECKING:` imports are the one list: the lazy table and `__all__` are
    derived from them, and nothing else in the `__init__` names the exports again."""
    checked = _checked_imports(path)
    assert type_checking_imports(str(path)) == checked
    source = path.read_text(encoding="utf-8")
    assert "__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)" in source
    assert source.count("__all__") == 1
    package = importlib.import_module(_package(path))
    names = [name for names in checked.values() for name in names]
    assert package.__all__ == sorted(names)
    assert len(set(names)) == len(names)


def test_mypy_reexports_the_lazy_packages() -> None:
    """mypy sees a lazy package's exports only with `implicit_reexport` (no `__all__` literal)."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    reexported = [
        module
        for override in settings["tool"]["mypy"]["overrides"]
        if override.get("implicit_reexport")
        for module in override["module"]
    ]
    assert sorted(reexported) == sorted(_package(path) for path in _lazy_packages())


@pytest.mark.parametrize("path", _lazy_packages(), ids=_package)
def test_every_exported_name_imports_in_a_fresh_interpreter(path: Path) -> None:
    package = _package(path)
    code = (
        "import importlib\n"
        f"package = importlib.import_module({package!r})\n"
        "names = list(package.__all__)\n"
        f"exec('from {package} import ' + ', '.join(names))\n"
        "missing = [n for n in names if n not in dir(package)]\n"
        "assert not missing, missing\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"from {package} import <__all__> failed:\n{result.stderr}"


def test_lazy_exports_imports_on_first_access_and_refuses_unknown_names(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text(
        "if TYPE_CHECKING:\n    from json import (\n        dumps,  # a comment\n        loads,\n"
        "    )\n    from ast import parse\nelse:\n    pass\n"
    )
    getattr_, dir_, all_ = lazy_exports(__name__, str(init))
    assert all_ == ["dumps", "loads", "parse"]
    assert getattr_("dumps") is json.dumps
    assert globals()["dumps"] is json.dumps  # kept on the module after the first access
    assert {"dumps", "loads", "parse"} <= set(dir_())
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        getattr_("nope")
    init.write_text("if TYPE_CHECKING:\n    from ast import parse\n    from json import parse\n")
    with pytest.raises(ValueError, match="parse is exported from both ast and json"):
        lazy_exports(__name__, str(init))
    init.write_text("if TYPE_CHECKING:\n    from json import dumps as dump\n")
    with pytest.raises(ValueError, match="no `as`"):
        lazy_exports(__name__, str(init))
    del globals()["dumps"]


def test_net_errors_and_the_transport_seam_load_no_aiohttp() -> None:
    """node.errors re-exports net's errors, and a MockTransport test needs no aiohttp: both
    stay light (aiohttp loads with the real transport only)."""
    loaded = _loaded_after("import net, net.errors, net.transport, net.mock")
    assert [name for name in loaded if name.split(".")[0] == "aiohttp"] == []
    assert "net.client" not in loaded
