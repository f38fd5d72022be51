"""Lazy public names of a package (PEP 562): `from pkg import Name` imports only the module that
defines Name, so importing one light module of a package never loads the rest of it."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports", "type_checking_imports"]

_BLOCK = re.compile(r"^if TYPE_CHECKING:\n((?:[ \t]+.*\n|\n)+)", re.M)
_IMPORT = re.compile(r"from\s+([\w.]+)\s+import\s+(\([^)]*\)|[^\n]*)")


def type_checking_imports(init_file: str) -> dict[str, list[str]]:
    """The names a package `__init__` imports under `if TYPE_CHECKING:`, by defining module.

    That block is the package's one export list: type checkers read it, and `lazy_exports`
    derives the lazy table and `__all__` from it (only `from MODULE import NAMES` lines)."""
    with open(init_file, encoding="utf-8") as file:
        source = file.read()
    block = _BLOCK.search(source)
    if block is None:
        raise ValueError(f"{init_file}: no `if TYPE_CHECKING:` block of exported names")
    exports: dict[str, list[str]] = {}
    for module, names in _IMPORT.findall(block.group(1)):
        text = re.sub(r"#[^\n]*", "", names).strip("() \n")
        found = [name.strip() for name in text.split(",") if name.strip()]
        if any(not name.isidentifier() for name in found):
            raise ValueError(f"{init_file}: import each name plainly (no `as`): {found}")
        exports.setdefault(module, []).extend(found)
    return exports


def lazy_exports(
    package: str, init_file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The module `__getattr__`, `__dir__` and `__all__` of `package`, whose public names are
    the ones its `__init__` (`init_file`) imports under `if TYPE_CHECKING:`. A name is imported
    on first access and then kept on the package; an unknown name raises AttributeError."""
    home: dict[str, str] = {}
    for module, names in type_checking_imports(init_file).items():
        for name in names:
            if name in home:
                raise ValueError(
                    f"{package}: {name} is exported from both {home[name]} and {module}"
                )
            home[name] = module

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return __getattr__, __dir__, sorted(home)
