"""shoal's public Python package: what runs inside users' processes (training scripts).

It imports none of shoal's internal packages (`config`, `net`, `wal`, `health`, `sync`, `node`),
whose generic names a script's own `config.py` or `node.py` would shadow: it speaks to the local
daemon over its HTTP API. Names load lazily, so `import shoal` costs little.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal._daemon import DaemonClient
    from shoal.errors import DaemonAnswerError, DaemonUnreachableError, ShoalError

__all__ = ["DaemonAnswerError", "DaemonClient", "DaemonUnreachableError", "ShoalError"]

_LAZY = {
    "DaemonClient": "shoal._daemon",
    "DaemonAnswerError": "shoal.errors",
    "DaemonUnreachableError": "shoal.errors",
    "ShoalError": "shoal.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
