"""The run queue as the daemon serves it: the RunService with its routes (node.runs.routes)
and its check, one component."""

from __future__ import annotations

from collections.abc import Mapping

from node.component import Check, Endpoint
from node.runs.routes import run_endpoints
from node.runs.service import RunService


class RunApi:
    """The run queue's component: opens and closes `service`, serves its routes and check."""

    def __init__(self, service: RunService) -> None:
        self.service = service

    async def open(self) -> None:
        await self.service.open()

    def routes(self) -> list[Endpoint]:
        return run_endpoints(self.service)

    def checks(self) -> Mapping[str, Check]:
        return self.service.checks()

    async def close(self) -> None:
        await self.service.close()
