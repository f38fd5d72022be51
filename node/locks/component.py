"""The lock API of a running daemon: the lock service, the node operations (drain, undrain,
leave) and their declared routes, made in one place so the daemon enters them as one
component."""

from __future__ import annotations

from collections.abc import Mapping

from node.component import Check, Endpoint, endpoints
from node.election.service import ElectionService
from node.locks.nodes import LeaveFn, NodeOps, StopFn
from node.locks.quorum import Durable
from node.locks.routes import LockRoutes, NodeRoutes
from node.locks.service import LockService
from node.runtime import NodeRuntime

LOOP_CHECK_INTERVAL_S = 1.0


class LockApi:
    """The lock service and the node operations plus their HTTP routes, as the daemon holds
    them: a component whose `open()` starts the lock service (its peer client and its expiry
    loop) and whose `close()` waits for a leave in progress, then stops the service."""

    def __init__(self, service: LockService, nodes: NodeOps) -> None:
        self.service = service
        self.nodes = nodes

    async def open(self) -> None:
        await self.service.open()

    def routes(self) -> list[Endpoint]:
        return endpoints(LockRoutes(self.service), NodeRoutes(self.nodes))

    def checks(self) -> Mapping[str, Check]:
        loop = self.service.loop_health
        return {"locks": Check(loop.check, interval_s=LOOP_CHECK_INTERVAL_S)}

    async def close(self) -> None:
        """Wait for a leave in progress, then stop the lock service. Idempotent."""
        await self.nodes.close()
        await self.service.close()


def lock_api(
    runtime: NodeRuntime,
    voters: tuple[str, ...],
    durable: Durable,
    secret: bytes | None,
    election: ElectionService,
    leave: LeaveFn,
    stop: StopFn,
) -> LockApi:
    """The lock component of a daemon (not opened yet): its table kept on `voters` (this node's
    share in `durable`), its calls signed with `secret`, and the election planning with the
    table's drains (attached here, before the election starts)."""
    service = LockService(runtime, voters, durable, secret)
    nodes = NodeOps(runtime, service, lambda: election.elector, leave, stop)
    nodes.attach(election)
    return LockApi(service, nodes)
