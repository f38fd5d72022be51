"""The GPU quarantine of a running daemon: the coordinator's routes (a node reports its fault,
asks to be re-admitted), this node's fault watcher and its `gpu_faults` check, and this node's
quarantine in /v1/status."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from health import GpuReader
from node.component import Check, Endpoint, endpoints
from node.locks.service import LockService
from node.plan import RolePlan
from node.quarantine.routes import QuarantineRoutes
from node.quarantine.service import CoordinatorLink, QuarantineService
from node.quarantine.watcher import GpuFaultWatcher
from node.runtime import NodeRuntime

CHECK_INTERVAL_S = 1.0


class GpuQuarantine:
    """A component: `open()` starts the watcher (when this node owns GPUs) and keeps the
    runtime's `quarantine` (the status document's) current; `close()` stops the watcher."""

    def __init__(
        self,
        runtime: NodeRuntime,
        locks: LockService,
        plan: Callable[[], RolePlan | None],
        reader: GpuReader,
    ) -> None:
        self.runtime = runtime
        self.service = QuarantineService(locks)
        self.watcher = GpuFaultWatcher(runtime, reader, CoordinatorLink(self.service), plan)

    async def open(self) -> None:
        self.runtime.refreshers.append(self._refresh)
        await self.watcher.open()

    def _refresh(self) -> None:
        self.runtime.quarantine = self.watcher.status()

    def routes(self) -> list[Endpoint]:
        return endpoints(QuarantineRoutes(self.service))

    def checks(self) -> Mapping[str, Check]:
        return {"gpu_faults": Check(self.watcher.check, interval_s=CHECK_INTERVAL_S)}

    async def close(self) -> None:
        """Stop the watcher. Idempotent."""
        await self.watcher.close()
