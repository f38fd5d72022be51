"""Lazy public names of a package (PEP 562): `from pkg import Name` imports only the module that
defines Name, so importing one light module of a package never loads the rest of it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package`, whose public names are defined in
    the modules of `exports` (module -> the names it defines, separated by spaces). A name is
    imported on first access and then kept on the package; an unknown name raises
    AttributeError.

    A package's `__init__` keeps its `__all__` literal and imports the same names under
    `if TYPE_CHECKING:` so type checkers see them; tests/test_imports.py checks that the three
    agree."""
    home: dict[str, str] = {}
    for module, names in exports.items():
        for name in names.split():
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

    return __getattr__, __dir__
