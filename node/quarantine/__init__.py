"""GPU quarantine: a node whose GPU reports a reset-class fault reports it to the coordinator,
which keeps the node out of training (in the lock table, on a majority of the voters) until its
GPUs pass a self-test and it asks to come back (docs/fault-tolerance.md#gpu-faults)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.quarantine.component import GpuQuarantine
    from node.quarantine.service import CoordinatorLink, QuarantineService
    from node.quarantine.state import Action, Phase, WatchState, step
    from node.quarantine.watcher import DeadlineReads, GpuFaultWatcher
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.quarantine.component": "GpuQuarantine",
            "node.quarantine.service": "CoordinatorLink QuarantineService",
            "node.quarantine.state": "Action Phase WatchState step",
            "node.quarantine.watcher": "DeadlineReads GpuFaultWatcher",
        },
    )

__all__ = [
    "Action",
    "CoordinatorLink",
    "DeadlineReads",
    "GpuFaultWatcher",
    "GpuQuarantine",
    "Phase",
    "QuarantineService",
    "WatchState",
    "step",
]
