"""The daemon's sync routes (`POST /v1/sync/run`, `GET /v1/sync/status`), each declared on its
handler, the run's body and answers, and the reading of a run's summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import TypedDict

from config.declare import READ, Caller, Refusal, Route, route
from node.openapi import WireRecord
from node.security import bad_request, json_error
from sync import PeerRef, SyncStats

RUN_PATH = "/v1/sync/run"
STATUS_PATH = "/v1/sync/status"


class SyncRunBody(BaseModel):
    """Body of `POST /v1/sync/run` (optional): which categories and stores (default all), from
    which alive peer (default every one), within how long (default sync_s per file category)."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    categories: list[str] = Field(default_factory=list)
    source: str | None = Field(default=None, alias="from", description="a node id")
    timeout_s: float | None = Field(default=None, gt=0, le=86_400)


class NodeFilesJson(TypedDict):
    """What came from one peer (NodeSyncStats) in a run's answer."""

    files_transferred: int
    bytes_transferred: int
    errors: tuple[str, ...]


class FileStatsJson(TypedDict):
    """One file category's entry of a run's answer (SyncStats)."""

    files_transferred: int
    bytes_transferred: int
    duration_seconds: float
    errors: list[str]
    nodes: dict[str, NodeFilesJson]
    deleted: int
    stale_beyond_tombstone_ttl: bool
    resurrected: int


class StorePullJson(TypedDict):
    """One record store's entry of a run's answer: its pulls from every peer."""

    pulled: int
    inserted: int
    duplicates: int
    errors: list[str]
    failed_nodes: dict[str, str]


class RunSummaryJson(TypedDict):
    """A sync run's answer (SyncRunSummary's JSON), also the status' `last_run`."""

    files: dict[str, FileStatsJson]
    records: dict[str, StorePullJson]
    peers: list[str]
    failed_nodes: list[str]
    nodes_synced: int
    duration_seconds: float
    finished_at: float


class SyncStatusJson(TypedDict):
    """The GET /v1/sync/status document (SyncStatus's JSON)."""

    running: bool
    progress: dict[str, int] | None
    last_run: RunSummaryJson | None
    interval_s: float | None
    peers: list[str]
    deletions: dict[str, dict[str, str | int]] | None
    fanout: dict[str, dict[str, int]]


class SyncRunSummary(WireRecord):
    """A sync run's summary: per-category SyncStats and record pulls, who failed."""

    files: dict[str, FileStatsJson]
    records: dict[str, StorePullJson]
    peers: list[str]
    failed_nodes: list[str] = Field(default_factory=list)
    nodes_synced: int | None = None


class Deletions(WireRecord):
    """A file category's deletion policy and its live tombstones."""

    policy: Literal["keep", "propagate"]
    tombstones: int = Field(ge=0)


class Fanout(WireRecord):
    """Per category: file bytes served to peers, piece bytes from peers and from origins."""

    served_bytes: int | None = None
    from_peers_bytes: int | None = None
    from_origin_bytes: int | None = None


class SyncStatus(WireRecord):
    """The last sync run, whether one is running, the peers."""

    running: bool
    progress: dict[str, int] | None
    last_run: RunSummaryJson | None
    interval_s: float | None
    peers: list[str]
    deletions: dict[str, Deletions] | None = Field(
        default=None, description="per file category: policy (keep or propagate) and tombstones"
    )
    fanout: dict[str, Fanout] = Field(default_factory=dict)


def stats_dict(stats: SyncStats) -> FileStatsJson:
    """One file category's entry of a run's answer."""
    nodes = {
        peer: NodeFilesJson(
            files_transferred=node.files_transferred,
            bytes_transferred=node.bytes_transferred,
            errors=node.errors,
        )
        for peer, node in stats.nodes.items()
    }
    return FileStatsJson(
        files_transferred=stats.files_transferred,
        bytes_transferred=stats.bytes_transferred,
        duration_seconds=stats.duration_seconds,
        errors=list(stats.errors),
        nodes=nodes,
        deleted=stats.deleted,
        stale_beyond_tombstone_ttl=stats.stale_beyond_tombstone_ttl,
        resurrected=stats.resurrected,
    )


def run_errors(result: RunSummaryJson) -> list[str]:
    """Every error line of a run summary (files, then records)."""
    errors: list[str] = []
    for section in (result["files"], result["records"]):
        for name, stats in section.items():
            errors.extend(f"{name}: {line}" for line in stats["errors"])
    return errors


def run_moved(result: RunSummaryJson) -> tuple[int, int]:
    """(files installed, records inserted) by a run summary."""
    files = sum(s["files_transferred"] for s in result["files"].values())
    records = sum(s["inserted"] for s in result["records"].values())
    return files, records


class SyncRunner(Protocol):
    """What the sync routes run: node.sync_service.SyncService."""

    def categories(self) -> list[str]: ...

    def alive_peers(self) -> Sequence[PeerRef]: ...

    async def run_once(
        self, categories: Sequence[str], peers: Sequence[PeerRef], timeout_s: float | None = None
    ) -> RunSummaryJson: ...

    def status(self) -> SyncStatusJson: ...


def _run_docs(routes: SyncRoutes, found: Route) -> list[Route]:
    """POST /v1/sync/run as documented: its `categories` are this node's (the file categories
    and the record stores)."""
    body = SyncRunBody.model_json_schema()
    body["properties"]["categories"]["items"]["enum"] = routes.runner.categories()
    return [replace(found, body=body)]


class SyncRoutes:
    """POST /v1/sync/run and GET /v1/sync/status of `runner`."""

    def __init__(self, runner: SyncRunner) -> None:
        self.runner = runner

    @route(
        "POST",
        RUN_PATH,
        callers=[Caller.OPERATOR],
        answers=((200, "per-category SyncStats and record pulls"),),
        errors=[
            Refusal(400, "bad_request", "unknown category or malformed body"),
            Refusal(404, "not_found", "`from` is not an alive peer"),
        ],
        body=SyncRunBody,
        body_optional=True,
        answer=SyncRunSummary,
        each=_run_docs,
    )
    async def run(self, request: web.Request) -> web.Response:
        """Sync now (all categories and stores from every alive peer unless narrowed); answers
        the per-category stats, failed_nodes and nodes_synced"""
        raw = await request.read()
        try:
            body = SyncRunBody.model_validate_json(raw) if raw else SyncRunBody()
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in error["loc"]) or "body"
            raise bad_request(f"{where}: {error['msg']}") from None
        known = self.runner.categories()
        if any(c not in known for c in body.categories):
            raise bad_request(f"categories: each must be one of {', '.join(known)}")
        source = body.source
        peers = [p for p in self.runner.alive_peers() if source is None or p.node_id == source]
        if source is not None and not peers:
            return json_error(404, f"from: {source} is not an alive peer of this node")
        summary = await self.runner.run_once(body.categories or known, peers, body.timeout_s)
        return web.json_response(summary)

    @route("GET", STATUS_PATH, callers=READ, answer=SyncStatus)
    async def status(self, request: web.Request) -> web.Response:
        """The last sync run, whether one is running, the peers"""
        return web.json_response(self.runner.status())
