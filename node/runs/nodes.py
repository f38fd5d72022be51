"""How a run starts and stops the nodes it needs: through a node provider (node.providers).
Before the job, the provider's stopped nodes are chosen and the choice stored in the run's record
(`nodes_to_start`), then exactly those are started (again, harmlessly, after a failover);
afterwards, unless keep-alive, exactly those are stopped again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from node.errors import ProviderError, RunError
from node.providers import STOPPED, Provider
from node.runs.queue import RunRecord


class NodeStarter(Protocol):
    """Chooses the nodes a run starts (`stopped`), starts them (answering a note) and stops
    them afterwards; `start` and `stop` may be repeated for the same run."""

    async def stopped(self, run: RunRecord) -> list[str]: ...
    async def start(self, run: RunRecord, ids: Sequence[str]) -> str: ...
    async def stop(self, run: RunRecord) -> str: ...


class StaticNodes:
    """No provider configured: the nodes are always on; nothing to start or stop."""

    async def stopped(self, run: RunRecord) -> list[str]:
        return []

    async def start(self, run: RunRecord, ids: Sequence[str]) -> str:
        return "no provider: the nodes are always running, nothing to start"

    async def stop(self, run: RunRecord) -> str:
        return "no provider: nothing to stop"


class ProviderNodes:
    """A NodeStarter over `provider` (static: every call a no-op it reports; local: daemons)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    async def stopped(self, run: RunRecord) -> list[str]:
        try:
            return [h.id for h in await self.provider.list() if h.state == STOPPED]
        except ProviderError as exc:
            raise RunError(
                502, "nodes_not_listed", f"provider {self.provider.name}: {exc}"
            ) from exc

    async def start(self, run: RunRecord, ids: Sequence[str]) -> str:
        name = self.provider.name
        wanted = set(ids)
        try:
            notes = []
            for handle in await self.provider.list():
                if handle.id in wanted:
                    result = await self.provider.start(handle)
                    notes.append(f"{handle.id}: {result.message or 'started'}")
        except ProviderError as exc:
            raise RunError(502, "nodes_not_started", f"provider {name}: {exc}") from exc
        return f"provider {name}: {'; '.join(notes) or 'no stopped node to start'}"

    async def stop(self, run: RunRecord) -> str:
        name = self.provider.name
        wanted = set(run.started_nodes)
        try:
            notes = []
            for handle in await self.provider.list():
                if handle.id in wanted:
                    result = await self.provider.stop(handle)
                    notes.append(f"{handle.id}: {result.message or 'stopped'}")
        except ProviderError as exc:
            raise RunError(502, "nodes_not_stopped", f"provider {name}: {exc}") from exc
        return f"provider {name}: {'; '.join(notes) or 'nothing this run started to stop'}"
