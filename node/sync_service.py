"""Data sync in the daemon: file categories through the SyncCoordinator, record stores by
cursor pulls, on an interval (the node's one background sync loop, reported to the `sync`
health component) and on request (`POST /v1/sync/run`, `shoal sync`). A push (`POST
/v1/sync/{category}/pull`) carries the plan's fence and is refused under another plan."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from aiohttp import web

from config import ConfigError, Inventory, error_body
from health import LoopHealth
from net import Identity, PeerClient, peer_url
from node.component import Endpoint, endpoints
from node.fence import FenceSource, fence_headers, fenced
from node.identity.peers import peer_tls
from node.membership.service import Membership, MemberState
from node.metrics import FanoutCollector, SyncMetrics
from node.runtime import NodeRuntime
from node.ssh.executor import DEFAULT_KNOWN_HOSTS, SSHPool, endpoint_of
from node.ssh.relay import pooled_connector
from node.sync_routes import (
    FileStatsJson,
    RunSummaryJson,
    StorePullJson,
    SyncRoutes,
    SyncStatusJson,
    run_errors,
    run_moved,
    stats_dict,
)
from sync import (
    FILE_CATEGORIES,
    FileCatalog,
    FileHandlers,
    HttpTransport,
    PeerRef,
    PieceBook,
    PieceHandlers,
    RateLimiter,
    RecordPullError,
    RecordStores,
    RsyncTransport,
    SshTarget,
    SwarmTransport,
    SyncCoordinator,
    SyncStats,
    Transport,
    pull_records,
)
from wal import SYNC_COMPLETED, WalError, WriteAheadLog

log = logging.getLogger(__name__)

PULL_SUFFIX = "/pull"


def _forbidden(reason: str) -> web.HTTPForbidden:
    text = json.dumps(error_body(403, reason, "forbidden"))
    return web.HTTPForbidden(text=text, content_type="application/json")


class SyncService:
    """Owns the file catalog, the HTTP transport, the coordinator and the record pulls."""

    def __init__(
        self,
        runtime: NodeRuntime,
        secret: bytes | None,
        interval_s: float,
        inventory: Inventory | None = None,
        fence: FenceSource | None = None,
        metrics: SyncMetrics | None = None,
    ) -> None:
        self._runtime = runtime
        self._metrics = metrics
        self._fence: FenceSource = fence if fence is not None else lambda: None
        self.loop_health = LoopHealth("sync")
        if interval_s <= 0:
            self.loop_health.record_success("background sync is off (sync_interval_s 0)")
        self._inventory = inventory
        self._secret = secret
        self._interval_s = interval_s
        self._stack = AsyncExitStack()
        self._membership: Membership | None = None
        self._stores: RecordStores | None = None
        self._wal: WriteAheadLog | None = None
        self._peers: PeerClient | None = None
        self._lock = asyncio.Lock()
        self.catalog: FileCatalog | None = None
        self.coordinator: SyncCoordinator | None = None
        self.pieces = PieceBook()
        self.last_run: RunSummaryJson | None = None
        self.running = False

    async def open(self, wal: WriteAheadLog, stores: RecordStores) -> None:
        """Open the catalog and coordinator, then resume transfers the WAL says were cut off."""
        runtime = self._runtime
        settings = runtime.settings
        self._wal = wal
        self._stores = stores
        catalog = await self._stack.enter_async_context(
            FileCatalog.for_settings(settings, node_id=runtime.node_id)
        )
        http = HttpTransport(
            node_id=runtime.node_id,
            secret=self._secret,
            timeouts=settings.timeouts,
            cluster=settings.cluster_name,
            tls=peer_tls(runtime),
        )
        self._stack.push_async_callback(http.close)
        swarm = SwarmTransport(
            http,
            self.pieces,
            self.alive_peers,
            node_id=runtime.node_id,
            breakers=runtime.breakers,
            timeouts=settings.timeouts,
        )
        transports: dict[str, Transport] = {"http": swarm}
        if "rsync" in settings.sync_transports:
            transports["rsync"] = self._rsync()
        coordinator = SyncCoordinator(
            catalog,
            http,
            self_peer=PeerRef(runtime.node_id, self._self_url()),
            wal=wal,
            breakers=runtime.breakers,
            metrics=runtime.metrics,
            peers_fn=self.alive_peers,
            transports=transports,
            fence=lambda: fence_headers(self._fence()),
        )
        self._stack.push_async_callback(coordinator.close)
        if runtime.metrics is not None:
            registry = runtime.metrics.registry
            collector = FanoutCollector(self.pieces.tallies, tuple(FILE_CATEGORIES))
            registry.register(collector)
            self._stack.callback(registry.unregister, collector)
        await coordinator.start()
        result = await wal.recover(coordinator.recovery_handlers())
        log.info("sync: WAL recovery of transfers: %s", result)
        self._peers = PeerClient(
            Identity(self._secret, runtime.node_id, settings.cluster_name),
            timeouts=settings.timeouts.model_copy(
                update={"http_request_s": settings.timeouts.sync_s}
            ),
            tls=peer_tls(runtime),
        )
        self._stack.push_async_callback(self._peers.close)
        self.catalog = catalog
        self.coordinator = coordinator

    def _rsync(self) -> RsyncTransport:
        """The rsync transport over the inventory's hosts (sync_transports names rsync); its
        remote shells share one pooled SSH connection per host (idle expiry)."""
        settings = self._runtime.settings
        if self._inventory is None:
            raise ConfigError(
                "sync_transports: rsync needs an inventory (ssh_host, ssh_user, ssh_key of "
                "every host); add --inventory or drop rsync"
            )
        pool = SSHPool(
            settings.ssh_known_hosts or DEFAULT_KNOWN_HOSTS,
            connect_timeout_s=settings.timeouts.ssh_connect_s,
        )
        self._stack.push_async_callback(pool.close)
        hosts = self._inventory.hosts
        rsync = RsyncTransport(
            {n: SshTarget.from_host(h) for n, h in hosts.items()},
            known_hosts=settings.ssh_known_hosts,
            timeouts=settings.timeouts,
            connections=pooled_connector(pool, {n: endpoint_of(n, h) for n, h in hosts.items()}),
        )
        self._stack.push_async_callback(rsync.close)
        return rsync

    def _self_url(self) -> str:
        return peer_url(self._runtime.address, self._runtime.port or self._runtime.settings.port)

    def attach(self, membership: Membership) -> None:
        self._membership = membership

    def alive_peers(self) -> Sequence[PeerRef]:
        if self._membership is None:
            return []
        return [
            PeerRef(
                m.node_id,
                peer_url(m.address, m.port),
                transports=tuple(self._runtime.settings.sync_transports),
            )
            for m in self._membership.members()
            if m.state is MemberState.ALIVE and not m.is_self
        ]

    def member_source(self, source: PeerRef) -> PeerRef:
        """`source` when it is an alive member of this node's view at the member's own URL; a
        push names its source, and the node must never connect to an address a caller chose."""
        for peer in self.alive_peers():
            if peer.node_id == source.node_id:
                if peer.url != source.url:
                    raise _forbidden(
                        f"peer {source.node_id} is at {peer.url} in this node's view, not at "
                        f"{source.url}; a push must name the member's own URL"
                    )
                return dataclasses.replace(peer, transports=source.transports or peer.transports)
        raise _forbidden(
            f"peer {source.node_id} is not an alive member of this node's view; this node "
            "pulls only from its members (see GET /v1/peers)"
        )

    def categories(self) -> list[str]:
        """What this node syncs: the file categories, then its record stores."""
        return [*FILE_CATEGORIES, *(self._stores or {})]

    def routes(self) -> list[Endpoint]:
        """The declared file and piece routes plus run/status. Built after open(); handlers
        read state lazily. A push (`POST .../pull`) under another plan than this node's is
        refused with 409."""

        async def pull(category: str, path: str, content_hash: str, source: PeerRef) -> Any:
            if self.coordinator is None:
                raise web.HTTPServiceUnavailable(reason="sync is not running yet")
            return await self.coordinator.pull_file(
                category, path, content_hash, self.member_source(source)
            )

        assert self.catalog is not None, "open() before routes()"
        cap = self._runtime.settings.sync_upload_limit_bytes_s
        limiter = RateLimiter(cap) if cap else None  # one cap for every file route
        files = FileHandlers(self.catalog, pull, limiter, self.pieces.count_served)
        pieces = PieceHandlers(self.catalog, self.pieces, limiter)
        return [
            dataclasses.replace(found, handler=fenced(found.handler, self._fence))
            if found.route.method == "POST" and found.route.path.endswith(PULL_SUFFIX)
            else found
            for found in endpoints(files, pieces, SyncRoutes(self))
        ]

    def status(self) -> SyncStatusJson:
        """The GET /v1/sync/status document (also the dashboard's `sync` topic)."""
        return SyncStatusJson(
            running=self.running,
            progress=self.coordinator.progress.to_dict() if self.coordinator else None,
            last_run=self.last_run,
            interval_s=self._interval_s,
            peers=[p.node_id for p in self.alive_peers()],
            deletions=self._deletions(),
            fanout=self.pieces.tallies(),
        )

    def _deletions(self) -> dict[str, dict[str, str | int]] | None:
        """Per file category: its deletion policy and how many live tombstones it serves."""
        return None if self.catalog is None else self.catalog.deletion_summary()

    async def run_once(
        self, categories: Sequence[str], peers: Sequence[PeerRef], timeout_s: float | None = None
    ) -> RunSummaryJson:
        """Sync `categories` from `peers` now (one run at a time), the file categories within
        `timeout_s` (default sync_s per file category); returns a JSON summary with the peers
        that failed (`failed_nodes`) and how many did not (`nodes_synced`)."""
        async with self._lock:
            self.running = True
            if self.coordinator is not None:
                self.coordinator.progress.reset()
            started = time.monotonic()
            try:
                files_stats: dict[str, FileStatsJson] = {}
                records: dict[str, StorePullJson] = {}
                failed: set[str] = set()
                files = [c for c in categories if c in FILE_CATEGORIES]
                if files and self.coordinator is not None:
                    budget = timeout_s or self._runtime.settings.timeouts.sync_s * len(files)
                    cluster = await self.coordinator.full_cluster_sync(files, budget, peers)
                    for category, stats in cluster.category_stats.items():
                        files_stats[category] = stats_dict(stats)
                        self._count_files(category, stats)
                    failed.update(cluster.failed_nodes)
                for category in categories:
                    if self._stores is not None and category in self._stores:
                        pulled = await self._pull_store(category, peers)
                        records[category] = pulled
                        failed.update(pulled["failed_nodes"])
                result = RunSummaryJson(
                    files=files_stats,
                    records=records,
                    peers=[p.node_id for p in peers],
                    failed_nodes=sorted(failed),
                    nodes_synced=len({p.node_id for p in peers} - failed),
                    duration_seconds=round(time.monotonic() - started, 3),
                    finished_at=time.time(),
                )
                self.last_run = result
                await self._log_completed(result)
                return result
            finally:
                self.running = False

    def _count_files(self, category: str, stats: SyncStats) -> None:
        """Files and bytes installed per peer, and every failure by its reason."""
        metrics = self._metrics
        if metrics is None:
            return
        for peer, node in stats.nodes.items():
            metrics.installed(category, peer, node.files_transferred, node.bytes_transferred)
        for error in stats.errors:
            metrics.failed(category, error)

    async def _pull_store(self, store: str, peers: Sequence[PeerRef]) -> StorePullJson:
        assert self._stores is not None
        assert self._wal is not None
        assert self._peers is not None
        counts = {"pulled": 0, "inserted": 0, "duplicates": 0}
        errors: list[str] = []
        failed: dict[str, str] = {}
        for peer in peers:
            key = f"records.cursor.{store}.{peer.node_id}"
            saved = await self._wal.state_get(key)
            since = (float(saved[0]), saved[1]) if isinstance(saved, list) else None
            breaker = self._runtime.breakers.breaker_for(peer.node_id, "http")
            try:
                async with breaker:
                    pulled = await pull_records(
                        self._peers,
                        peer.url,
                        store,
                        self._stores[store],
                        since=since,
                        source_node=peer.node_id,
                    )
            except RecordPullError as exc:
                pulled = exc.result
                errors.append(f"{peer.node_id}: {exc}")
                failed[peer.node_id] = str(exc)
            except Exception as exc:  # a peer's failure is counted, the loop goes on
                errors.append(f"{peer.node_id}: {exc}")
                failed[peer.node_id] = str(exc)
                continue
            if pulled.cursor is not None:
                await self._wal.state_set(key, list(pulled.cursor))
            metrics = self._metrics
            if metrics is not None:
                metrics.pulled(store, peer.node_id, pulled.inserted, pulled.duplicates)
            for field in counts:
                counts[field] += getattr(pulled, field)
        return StorePullJson(
            pulled=counts["pulled"],
            inserted=counts["inserted"],
            duplicates=counts["duplicates"],
            errors=errors,
            failed_nodes=failed,
        )

    async def _log_completed(self, result: RunSummaryJson) -> None:
        """A run that moved files or records is a committed `sync_completed` WAL entry (what
        came from whom, when), so `shoal wal` shows the node's sync history."""
        files, records = run_moved(result)
        if self._wal is None or not (files or records):
            return
        payload = {
            "peers": result["peers"],
            "files": {c: s["files_transferred"] for c, s in result["files"].items()},
            "bytes": sum(s["bytes_transferred"] for s in result["files"].values()),
            "records": {store: s["inserted"] for store, s in result["records"].items()},
            "errors": len(run_errors(result)),
            "duration_s": result["duration_seconds"],
        }
        try:
            await self._wal.commit(await self._wal.append(SYNC_COMPLETED, payload))
        except WalError as exc:  # the data is in place; only its history line is missing
            log.warning("sync: cannot log the completed run in the WAL: %s", exc)

    async def run_forever(self) -> None:
        """The node's one background sync loop: pull from alive peers every interval. Each
        round is reported to `loop_health` (degraded with the last error while rounds keep
        failing); a failure is logged once at WARNING and the loop goes on."""
        if self._interval_s <= 0:
            return
        warned = False
        while True:
            await asyncio.sleep(self._interval_s)
            peers = self.alive_peers()
            if not peers:
                self.loop_health.record_success("no alive peers to sync from")
                continue
            try:
                result = await self.run_once([*FILE_CATEGORIES, *(self._stores or {})], peers)
            except Exception as exc:  # recorded, never fatal for the daemon
                self.loop_health.record_failure(exc)
                log.log(logging.DEBUG if warned else logging.WARNING, "sync round failed: %s", exc)
                warned = True
                continue
            errors = run_errors(result)
            if errors:
                self.loop_health.record_failure(errors[-1])
                log.log(logging.DEBUG if warned else logging.WARNING, "sync round: %s", errors[-1])
                warned = True
                continue
            warned = False
            files, records = run_moved(result)
            self.loop_health.record_success(
                f"last round: {files} files, {records} records from {len(peers)} peers"
            )

    async def close(self) -> None:
        """Close the session, coordinator and catalog. Idempotent."""
        self.coordinator = None
        await self._stack.aclose()
