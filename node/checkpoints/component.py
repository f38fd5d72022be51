"""The checkpoints of a running daemon: the node's service, the coordinator's office, their
declared routes and the loop's health check, made in one place so the daemon enters
them as one component."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from config import Inventory
from node.checkpoints.office import CheckpointOffice
from node.checkpoints.replicas import domains_of
from node.checkpoints.routes import CheckpointRoutes
from node.checkpoints.service import CheckpointService
from node.checkpoints.view import committed_view, last_restore_view
from node.component import Check, Endpoint, endpoints, loop_check
from node.locks.service import LockService
from node.membership.service import MemberState
from node.runtime import NodeRuntime
from node.sync_service import SyncService


class CheckpointApi:
    """The checkpoint service as a component: `open()` starts its loop (after the sync service
    and the locks opened), `close()` stops it."""

    def __init__(self, service: CheckpointService) -> None:
        self.service = service

    async def open(self) -> None:
        await self.service.open()

    def routes(self) -> list[Endpoint]:
        return endpoints(CheckpointRoutes(self.service))

    def checks(self) -> Mapping[str, Check]:
        return loop_check(self.service.loop_health)

    async def close(self) -> None:
        await self.service.close()

    def committed(self) -> JsonValue:
        """/v1/training's `committed`: the newest committed step this node heard of (its own
        book when it coordinates), or None."""
        log = self.service.log
        view = committed_view(None if log is None else log.newest)
        return None if view is None else view.model_dump(mode="json", by_alias=True)

    def last_restore(self) -> JsonValue:
        """This node's `last_restore` in /v1/training: its newest restore, or None."""
        view = last_restore_view(self.service.last_restore)
        return None if view is None else view.model_dump(mode="json", by_alias=True)


def alive_nodes(runtime: NodeRuntime) -> list[str]:
    """This node and every member its view holds alive."""
    membership = runtime.membership
    members = membership.members() if membership is not None else []
    alive = {m.node_id for m in members if m.state is MemberState.ALIVE}
    return sorted({runtime.node_id, *alive})


def checkpoint_api(
    runtime: NodeRuntime, locks: LockService, sync: SyncService, inventory: Inventory | None
) -> CheckpointApi:
    """The checkpoint component of a daemon (not opened yet): commits kept in `locks`' table,
    files served and fetched by `sync`, copies spread over `inventory`'s zones and racks."""
    settings = runtime.settings
    office = CheckpointOffice(
        locks,
        replicas=settings.checkpoint_replicas,
        keep=settings.checkpoint_keep,
        domains=domains_of(inventory),
        alive=lambda: alive_nodes(runtime),
        copy_after_s=settings.checkpoint_copy_after_s,
    )
    return CheckpointApi(CheckpointService(runtime, locks, sync, office))
