"""shoal's public Python package: what runs inside users' processes (training scripts).

    with shoal.training_session() as session:
        step = session.restore(state) or 0
        ...
        session.report(step, loss=loss.item())

It imports none of shoal's internal packages (`config`, `net`, `wal`, `health`, `sync`, `node`),
whose generic names a script's own `config.py` or `node.py` would shadow: it speaks to the local
daemon over its HTTP API. Names load lazily, so `import shoal` costs little (torch is imported
when a session starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal._daemon import DaemonClient
    from shoal.errors import (
        CheckpointError,
        DaemonAnswerError,
        DaemonUnreachableError,
        GroupError,
        SessionError,
        ShoalError,
    )
    from shoal.group import TrainingGroup
    from shoal.guard import GroupChanged
    from shoal.joining import Reform
    from shoal.place import RankPlace
    from shoal.session import TrainingSession, training_session

__all__ = [
    "CheckpointError",
    "DaemonAnswerError",
    "DaemonClient",
    "DaemonUnreachableError",
    "GroupChanged",
    "GroupError",
    "RankPlace",
    "Reform",
    "SessionError",
    "ShoalError",
    "TrainingGroup",
    "TrainingSession",
    "training_session",
]

_LAZY = {
    "DaemonClient": "shoal._daemon",
    "CheckpointError": "shoal.errors",
    "DaemonAnswerError": "shoal.errors",
    "DaemonUnreachableError": "shoal.errors",
    "GroupError": "shoal.errors",
    "SessionError": "shoal.errors",
    "ShoalError": "shoal.errors",
    "GroupChanged": "shoal.guard",
    "RankPlace": "shoal.place",
    "TrainingGroup": "shoal.group",
    "Reform": "shoal.joining",
    "TrainingSession": "shoal.session",
    "training_session": "shoal.session",
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
