"""The dashboard as the daemon wires it: its access rule, event hub, declared routes and gate."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from aiohttp.typedefs import Middleware

from node.component import Check, Endpoint, endpoints
from node.errors import JobError
from node.jobs.store import STREAMS
from node.ui.access import UiAccess, ui_gate
from node.ui.events import EventHub
from node.ui.peers import PEER_INTERVAL_S
from node.ui.routes import DashboardRoutes
from node.ui.topics import ClusterPeers, NodeSampler, UiSources, topic_functions


class Dashboard:
    """The web dashboard of one node (/ui/ and /v1/events). `await open()`, hand `routes()`,
    `docs()` and `middleware` to the app, `await close()` before the HTTP server stops (it
    ends the open event streams)."""

    def __init__(self, access: UiAccess, sources: UiSources) -> None:
        self.access = access
        self.peers = ClusterPeers(sources, PEER_INTERVAL_S)
        self.hub = EventHub(
            topic_functions(sources, self.peers),
            lambda job_id: _log_paths(sources, job_id),
            NodeSampler(sources).sample,
        )
        self._routes = DashboardRoutes(access, self.hub)
        self.middleware: Middleware = ui_gate(access)

    async def open(self) -> None:
        await self.hub.open()

    async def close(self) -> None:
        await self.hub.close()
        await self.peers.close()

    def routes(self) -> list[Endpoint]:
        return endpoints(self._routes)

    def checks(self) -> Mapping[str, Check]:
        return {}


def _log_paths(sources: UiSources, job_id: str) -> Mapping[str, Path] | None:
    if sources.jobs is None:
        return None
    try:
        entry = sources.jobs.get(job_id)
    except JobError:
        return None
    return {stream: entry.log_path(stream) for stream in STREAMS}
