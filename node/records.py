"""The record stores of a node as a component: the stores it opens (games, rollouts and those the
config declares) and the /v1/records routes, documented once per store."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from health import DiskWrites
from node.component import Check, Endpoint, endpoints
from node.rl.backlog import RolloutBacklog
from node.runtime import NodeRuntime
from sync import (
    ROLLOUTS_SCHEMA,
    RecordHandlers,
    RecordSchema,
    RecordStores,
)


class RecordsComponent:
    """Opens the record stores of `schemas` beside the built-in ones; serves their routes,
    the rollouts' POST admitted by `backlog` (429 while a run's backlog is full), each ingest
    counted by `on_ingest(store, accepted, duplicates)`."""

    def __init__(
        self,
        runtime: NodeRuntime,
        extra_schemas: Sequence[RecordSchema],
        backlog: RolloutBacklog,
        writes: DiskWrites | None = None,
        on_ingest: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self._runtime = runtime
        self._on_ingest = on_ingest
        self._backlog = backlog
        self.stores = RecordStores.for_settings(
            runtime.settings, extra_schemas=extra_schemas, writes=writes
        )

    async def open(self) -> None:
        await self.stores.open()

    def routes(self) -> list[Endpoint]:
        runtime = self._runtime
        handlers = RecordHandlers(
            self.stores,
            runtime.node_id,
            on_ingest=self._on_ingest,
            gate=self._backlog,
            gated=(ROLLOUTS_SCHEMA.name,),
        )
        return endpoints(handlers)

    def checks(self) -> Mapping[str, Check]:
        return {}

    async def close(self) -> None:
        await self.stores.close()
