"""The documentation of the daemon's sync routes (`POST /v1/sync/run`, `GET /v1/sync/status`),
the run's body, and the reading of its answer."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from node.openapi import RouteDoc
from sync import FILE_CATEGORIES, SyncStats

RUN_PATH = "/v1/sync/run"
STATUS_PATH = "/v1/sync/status"


class SyncRunBody(BaseModel):
    """Body of `POST /v1/sync/run` (optional): which categories and stores (default all), from
    which alive peer (default every one), within how long (default sync_s per file category)."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    categories: list[str] = Field(default_factory=list)
    source: str | None = Field(default=None, alias="from", description="a node id")
    timeout_s: float | None = Field(default=None, gt=0, le=86_400)


RUN_ANSWER = {
    "type": "object",
    "required": ["files", "records", "peers"],
    "properties": {
        "files": {"type": "object"},
        "records": {"type": "object"},
        "peers": {"type": "array", "items": {"type": "string"}},
        "failed_nodes": {"type": "array", "items": {"type": "string"}},
        "nodes_synced": {"type": "integer"},
    },
}
STATUS_ANSWER = {
    "type": "object",
    "required": ["running", "progress", "last_run", "interval_s", "peers"],
    "properties": {
        "running": {"type": "boolean"},
        "progress": {"type": ["object", "null"]},
        "last_run": {"type": ["object", "null"]},
        "interval_s": {"type": ["number", "null"]},
        "peers": {"type": "array", "items": {"type": "string"}},
        "deletions": {
            "type": ["object", "null"],
            "description": "per file category: policy (keep or propagate) and live tombstones",
            "additionalProperties": {
                "type": "object",
                "required": ["policy", "tombstones"],
                "properties": {
                    "policy": {"enum": ["keep", "propagate"]},
                    "tombstones": {"type": "integer", "minimum": 0},
                },
            },
        },
        "fanout": {
            "type": "object",
            "description": "Per category: file bytes served to peers (served_bytes), piece "
            "bytes received from peers and from origins",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "served_bytes": {"type": "integer"},
                    "from_peers_bytes": {"type": "integer"},
                    "from_origin_bytes": {"type": "integer"},
                },
            },
        },
    },
}


def stats_dict(stats: SyncStats) -> dict[str, Any]:
    """One file category's entry of a run's answer."""
    return {**dataclasses.asdict(stats), "errors": list(stats.errors)}


def run_errors(result: dict[str, Any]) -> list[str]:
    """Every error line of a run summary (files, then records)."""
    errors: list[str] = []
    for section in ("files", "records"):
        for name, stats in result.get(section, {}).items():
            errors.extend(f"{name}: {line}" for line in stats.get("errors", ()))
    return errors


def run_moved(result: dict[str, Any]) -> tuple[int, int]:
    """(files installed, records inserted) by a run summary."""
    files = sum(s["files_transferred"] for s in result.get("files", {}).values())
    records = sum(s["inserted"] for s in result.get("records", {}).values())
    return files, records


def sync_run_doc(stores: list[str]) -> RouteDoc:
    """The doc of POST /v1/sync/run: its `categories` are the file categories and the
    record `stores` this node serves."""
    run_body = SyncRunBody.model_json_schema()
    run_body["properties"]["categories"]["items"]["enum"] = [*FILE_CATEGORIES, *stores]
    return RouteDoc(
        "POST",
        RUN_PATH,
        "Sync now (all categories and stores from every alive peer unless narrowed); "
        "answers the per-category stats, failed_nodes and nodes_synced",
        (
            (200, "per-category SyncStats and record pulls"),
            (400, "unknown category or malformed body"),
            (404, "`from` is not an alive peer"),
        ),
        body=run_body,
        body_optional=True,
        response=RUN_ANSWER,
    )


def sync_status_doc() -> RouteDoc:
    """The doc of GET /v1/sync/status."""
    return RouteDoc(
        "GET",
        STATUS_PATH,
        "The last sync run, whether one is running, the peers",
        response=STATUS_ANSWER,
    )
