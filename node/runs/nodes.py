"""How a run starts and stops the nodes it needs: through a node provider (node.providers).
Before the job: every node of the provider that is stopped is started (the ids are stored in the
run's record); afterwards, unless keep-alive, exactly those are stopped again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from node.errors import ProviderError, RunError
from node.providers import STOPPED, Provider


class NodeStarter(Protocol):
    """Starts the nodes a run needs (answering a note and the ids it started) and stops them."""

    async def start(self, run: Mapping[str, Any]) -> tuple[str, list[str]]: ...
    async def stop(self, run: Mapping[str, Any]) -> str: ...


class StaticNodes:
    """No provider configured: the nodes are always on; nothing to start or stop."""

    async def start(self, run: Mapping[str, Any]) -> tuple[str, list[str]]:
        return "no provider: the nodes are always running, nothing to start", []

    async def stop(self, run: Mapping[str, Any]) -> str:
        return "no provider: nothing to stop"


class ProviderNodes:
    """A NodeStarter over `provider` (static: every call a no-op it reports; local: daemons)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    async def start(self, run: Mapping[str, Any]) -> tuple[str, list[str]]:
        name = self.provider.name
        try:
            started, notes = [], []
            for handle in await self.provider.list():
                if handle.state != STOPPED:
                    continue
                result = await self.provider.start(handle)
                notes.append(f"{handle.id}: {result.message or 'started'}")
                if result.changed:
                    started.append(handle.id)
        except ProviderError as exc:
            raise RunError(502, "nodes_not_started", f"provider {name}: {exc}") from exc
        return f"provider {name}: {'; '.join(notes) or 'no stopped node to start'}", started

    async def stop(self, run: Mapping[str, Any]) -> str:
        name = self.provider.name
        wanted = set(run.get("started_nodes") or [])
        try:
            notes = []
            for handle in await self.provider.list():
                if handle.id in wanted:
                    result = await self.provider.stop(handle)
                    notes.append(f"{handle.id}: {result.message or 'stopped'}")
        except ProviderError as exc:
            raise RunError(502, "nodes_not_stopped", f"provider {name}: {exc}") from exc
        return f"provider {name}: {'; '.join(notes) or 'nothing this run started to stop'}"
