"""full_cluster_sync: ask the local node to sync now from its alive peers, and its stats.

The node does the work (`POST /v1/sync/run`, as `shoal sync` does); this is the Python side.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from config import NodeSettings, load_settings, read_secret_file
from net import Identity, PeerClient, PeerRequestError
from sync.errors import SyncError
from sync.files.catalog import FILE_CATEGORIES
from sync.files.plan import (
    ClusterSyncStats,
    NodeSyncStats,
    RecordSyncStats,
    SyncStats,
    node_totals,
)

__all__ = ["cluster_stats_from_json", "full_cluster_sync"]

RUN_PATH = "/v1/sync/run"


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in value) if isinstance(value, list) else ()


def _node_stats(nodes: Mapping[str, Any]) -> dict[str, NodeSyncStats]:
    return {
        node: NodeSyncStats(
            int(counts["files_transferred"]),
            int(counts["bytes_transferred"]),
            _strings(counts["errors"]),
        )
        for node, counts in nodes.items()
    }


def cluster_stats_from_json(answer: Mapping[str, Any]) -> ClusterSyncStats:
    """The ClusterSyncStats of a node's `/v1/sync/run` answer; SyncError when it is malformed.

    `node_stats` holds the files and bytes from each peer, and its errors of every category
    and record store."""
    try:
        files = {
            category: SyncStats(
                int(stats["files_transferred"]),
                int(stats["bytes_transferred"]),
                float(stats["duration_seconds"]),
                _strings(stats["errors"]),
                _node_stats(stats.get("nodes", {})),
                deleted=int(stats.get("deleted", 0)),
                stale_beyond_tombstone_ttl=bool(stats.get("stale_beyond_tombstone_ttl", False)),
                resurrected=int(stats.get("resurrected", 0)),
            )
            for category, stats in answer.get("files", {}).items()
        }
        records = {
            store: RecordSyncStats(
                int(stats["pulled"]),
                int(stats["inserted"]),
                int(stats["duplicates"]),
                _strings(stats["errors"]),
            )
            for store, stats in answer.get("records", {}).items()
        }
        nodes = node_totals(files)
        for store, stats in answer.get("records", {}).items():
            for node, error in stats.get("failed_nodes", {}).items():
                failure = NodeSyncStats(errors=(f"{store}: {error}",))
                nodes[node] = nodes.get(node, NodeSyncStats()) + failure
        return ClusterSyncStats(
            total_files=sum(stats.files_transferred for stats in files.values()),
            total_bytes=sum(stats.bytes_transferred for stats in files.values()),
            nodes_synced=int(answer["nodes_synced"]),
            failed_nodes=_strings(answer["failed_nodes"]),
            category_stats=files,
            record_stats=records,
            node_stats=dict(sorted(nodes.items())),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise SyncError(f"malformed sync answer ({type(exc).__name__}: {exc})") from exc


async def full_cluster_sync(
    categories: Sequence[str] | None = None,
    timeout_s: float | None = None,
    *,
    source: str | None = None,
    node_url: str | None = None,
    settings: NodeSettings | None = None,
) -> ClusterSyncStats:
    """Have the local node (or the node at `node_url`) sync `categories` (default: every file
    category and record store) from its alive peers, or only from `source`, the file
    categories within `timeout_s` (default sync_s per category); wait for the stats.

    `settings` default to the node's own (config file, environment); the request is signed
    when they name a secret file. SyncError naming the URL when the node refuses or cannot be
    reached.
    """
    if settings is None:
        settings = load_settings().settings
    base = node_url.rstrip("/") if node_url else settings.local_url
    url = base + RUN_PATH
    secret = None if settings.secret_file is None else read_secret_file(settings.secret_file)
    identity = Identity(secret, f"api-{socket.gethostname()}")
    budget_s = (
        timeout_s if timeout_s is not None else settings.timeouts.sync_s * len(FILE_CATEGORIES)
    )
    body = {"categories": list(categories or []), "from": source, "timeout_s": timeout_s}
    wait_s = 2 * budget_s + settings.timeouts.http_request_s
    try:
        async with PeerClient(identity, timeouts=settings.timeouts) as peers:
            response = await peers.request(
                "POST", base, RUN_PATH, json=body, timeout_s=wait_s, check=False
            )
        payload, status = response.body, response.status
    except PeerRequestError as exc:
        raise SyncError(f"{url}: {exc.reason}") from exc
    try:
        answer = orjson.loads(payload)
    except ValueError as exc:
        raise SyncError(f"{url}: HTTP {status}: answer is not JSON") from exc
    if status != 200 or not isinstance(answer, dict):
        reason = answer.get("reason") or answer.get("error") if isinstance(answer, dict) else answer
        raise SyncError(f"{url}: HTTP {status}: {reason}")
    return cluster_stats_from_json(answer)
