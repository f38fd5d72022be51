"""SyncCoordinator: pulls what peers have and this node lacks, category by category, each file
through the peer's breakers and logged in the WAL; pushes on request (with the plan's fence).
The background loop is the daemon's (node.sync_service); crash recovery is recovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from config.closing import AsyncClosing
from config.quietlog import QuietLog
from health import BreakerRegistry, CircuitOpenError, NodeMetrics
from sync.errors import (
    ContentMismatchError,
    FileChangedError,
    FileSyncError,
    FileTransferError,
)
from sync.files.batches import BatchPulls
from sync.files.catalog import FileCatalog
from sync.files.deletions import DeletionRound, apply_deletions
from sync.files.manifest import ManifestEntry
from sync.files.plan import (
    ClusterSyncStats,
    FallbackSources,
    PullItem,
    SyncOptions,
    SyncProgress,
    SyncStats,
    node_totals,
    plan_pulls,
)
from sync.files.recovery import FileRecovery, install_copy, local_entry, partial_size
from sync.files.rounds import (
    ListedRound,
    Outcome,
    RoundTally,
    TransferLog,
    file_payload,
    gather_listings,
    plan_batches,
    tracked_pull,
)
from sync.guards import check_free_space, dest_path
from sync.transports.http import HttpTransport, RemoteManifest
from sync.transports.protocol import PeerRef, TransferResult, Transport
from wal import WalError, WriteAheadLog

__all__ = ["FenceHeaders", "PeersFn", "SyncCoordinator", "SyncOptions"]

logger = logging.getLogger(__name__)

PeersFn = Callable[[], Sequence[PeerRef] | Awaitable[Sequence[PeerRef]]]
FenceHeaders = Callable[[], Mapping[str, str]]
"""The headers naming the plan this node acts under (`X-Shoal-Fence: term.version`), sent with
each request it makes because of the plan; empty while it applies none."""
RETRYABLE = (ContentMismatchError, FileTransferError)


class SyncCoordinator(BatchPulls, AsyncClosing):
    """File sync of one node (async context manager; close() is idempotent).

    Owns no connection: the catalog, transports and WAL are opened and closed by the caller.
    Call `start()` (sweeps stale temp files) before `wal.recover(recovery_handlers())`.
    """

    def __init__(
        self,
        catalog: FileCatalog,
        http: HttpTransport,
        *,
        self_peer: PeerRef,
        wal: WriteAheadLog | None = None,
        breakers: BreakerRegistry | None = None,
        metrics: NodeMetrics | None = None,
        transports: Mapping[str, Transport] | None = None,
        options: SyncOptions | None = None,
        peers_fn: PeersFn | None = None,
        fence: FenceHeaders | None = None,
    ) -> None:
        self.catalog = catalog
        self.http = http
        self.self_peer = self_peer
        self.options = options if options is not None else SyncOptions()
        self._wal = wal
        self._log = TransferLog(wal)
        self._breakers = breakers if breakers is not None else BreakerRegistry()
        self._metrics = metrics
        self._transports: dict[str, Transport] = dict(transports or {"http": http})
        self._peers_fn = peers_fn
        self._fence = fence
        self._large = asyncio.Semaphore(self.options.max_large_transfers)
        self._small = asyncio.Semaphore(self.options.max_small_transfers)
        self._in_flight: set[tuple[str, str]] = set()
        self._quiet = QuietLog(logger)
        self._recovery = FileRecovery(
            catalog, http, wal, self._breakers, self.options, self.install
        )
        self.last_stats: dict[str, SyncStats] = {}
        self.progress = SyncProgress()
        self._settled: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        self._closed = False

    async def _enter(self) -> None:
        await self.start()

    async def start(self) -> None:
        """Remove stale temp files, and partial files no pending WAL entry will resume."""
        await self._recovery.sweep()

    async def close(self) -> None:
        """Refuse new work; idempotent. Transfers in flight belong to their callers' tasks."""
        self._closed = True

    def recovery_handlers(self) -> dict[str, Callable[..., Awaitable[object]]]:
        """Handlers for `wal.recover`: resume (or clean up) each interrupted transfer."""
        return self._recovery.handlers()

    async def _peers(self, peers: Sequence[PeerRef] | None) -> list[PeerRef]:
        if peers is None:
            if self._peers_fn is None:
                return []
            found = self._peers_fn()
            peers = await found if inspect.isawaitable(found) else found
        return [peer for peer in peers if peer.node_id != self.self_peer.node_id]

    async def _list_remote(self, peer: PeerRef, category: str) -> RemoteManifest:
        async with self._breakers.breaker_for(peer.node_id, "http"):
            return await self.http.list_manifest(peer, category, self.catalog.piece_size)

    async def sync(self, category: str, peers: Sequence[PeerRef] | None = None) -> SyncStats:
        """Pull from `peers` (default: the peers function's alive peers) the files of
        `category` that are new or newer there. Failures are counted in the stats."""
        stats, _ = await self._sync_category(category, await self._peers(peers))
        return stats

    async def _sync_category(
        self, category: str, peers: list[PeerRef]
    ) -> tuple[SyncStats, set[str]]:
        """One round: list both sides, apply tombstones, plan, transfer, tally."""
        if self._closed:
            raise FileSyncError("sync coordinator is closed")
        started = time.monotonic()
        self.catalog.root(category)
        tally = RoundTally()
        listed = await self._list_round(category, peers, tally)
        deletions = DeletionRound(listed.remotes)
        if self.catalog.propagates(category):
            deletions = await apply_deletions(
                self.catalog,
                category,
                self.self_peer.node_id,
                listed.local,
                listed.with_tombstones(),
            )
        plan = self._plan_round(category, listed, deletions.remotes)
        tally.count(plan, await self._transfer(category, plan))
        duration = time.monotonic() - started
        if self._metrics is not None:
            self._metrics.observe_sync(category, duration)
        stats = tally.stats(duration, deletions)
        self.last_stats[category] = stats
        return stats, tally.failed

    async def _list_round(
        self, category: str, peers: list[PeerRef], tally: RoundTally
    ) -> ListedRound:
        """This node's listing and every peer's manifest; a peer that fails to answer is
        counted in `tally`, one sharing this node's storage is skipped."""
        local_id = self.catalog.shared_id(category)
        local, results = await gather_listings(
            self.catalog.listing(category), [self._list_remote(p, category) for p in peers]
        )
        listed = ListedRound(local)
        for peer, remote in zip(peers, results, strict=True):
            if isinstance(remote, asyncio.CancelledError):
                raise remote
            if isinstance(remote, BaseException):
                self._warn(
                    f"manifest:{peer.node_id}", "manifest of %s failed: %s", peer.node_id, remote
                )
                if self._metrics is not None:
                    self._metrics.record_request_error(peer.node_id)
                tally.peer_failed(peer.node_id, f"manifest: {remote}")
                continue
            self._quiet.clear(f"manifest:{peer.node_id}")
            if local_id is not None and remote.shared_id == local_id:
                logger.debug("%s shares %s with this node; nothing to copy", peer.node_id, category)
                continue
            listed.add(peer, remote)
        return listed

    def _plan_round(
        self,
        category: str,
        listed: ListedRound,
        remotes: list[tuple[PeerRef, tuple[ManifestEntry, ...]]],
    ) -> list[PullItem]:
        """The pulls of this round (none when neither side changed since a round that found
        nothing to pull), added to the progress."""
        settled = listed.settled_key
        if self._settled.get(category) == settled and listed.all_etags:
            plan: list[PullItem] = []
        else:
            local = listed.local
            plan = plan_pulls(dict(zip(local.paths, local.entries, strict=True)), remotes)
        if not plan:
            self._settled[category] = settled
        self.progress.files_total += len(plan)
        self.progress.bytes_total += sum(item.entry.size for item in plan)
        return plan

    async def _transfer(self, category: str, plan: list[PullItem]) -> dict[str, Outcome]:
        """Pull the plan: small files in batches per peer (a file the batch missed is pulled
        alone), the rest one by one; the outcome of each path."""
        batches, singles = plan_batches(plan, self.options)
        outcomes: dict[str, Outcome] = {}

        async def one(item: PullItem) -> None:
            try:
                outcomes[item.entry.path] = await tracked_pull(
                    self.progress,
                    item,
                    lambda: self._pull_item(category, item.entry, item.sources),
                )
            except Exception as exc:  # counted in the round's tally
                outcomes[item.entry.path] = exc

        async def batch(peer: PeerRef, items: list[PullItem]) -> None:
            done = await self._pull_batch(category, peer, items)
            outcomes.update(done)
            await asyncio.gather(*(one(item) for item in items if item.entry.path not in done))

        await asyncio.gather(
            *(batch(peer, items) for peer, items in batches), *(one(item) for item in singles)
        )
        return outcomes

    async def _pull_item(
        self, category: str, entry: ManifestEntry, sources: Sequence[PeerRef]
    ) -> TransferResult | None:
        key = (category, entry.path)
        if key in self._in_flight:
            return None
        self._in_flight.add(key)
        try:
            slots = self._large if entry.size >= self.options.large_file_bytes else self._small
            async with slots:
                plan = FallbackSources(sources[0], tuple(sources[1:]), self.options.timeouts.sync_s)
                return await self.fetch(category, entry, plan)
        finally:
            self._in_flight.discard(key)

    async def fetch(
        self, category: str, entry: ManifestEntry, sources: FallbackSources
    ) -> TransferResult:
        """Install `entry` from the first source that delivers it, logged in the WAL: a
        `sync_started` entry, committed once the file is in place (left pending by a crash or
        cancellation, so recovery resumes it; rolled back on failure)."""
        root = self.catalog.root(category)
        final = dest_path(root, entry.path)
        present = await asyncio.to_thread(partial_size, final.parent, entry.hash)
        await asyncio.to_thread(check_free_space, root, entry.size - present, self.options.reserve)
        wal_id = await self._log.begin(
            file_payload(sources.primary, category, entry), f"the transfer of {entry.path}"
        )
        try:
            result = await self.install(category, entry, sources)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await self._log.end(wal_id, f"{type(exc).__name__}: {exc}")
            raise
        try:
            await self._log.end(wal_id)
        except WalError as exc:
            raise FileSyncError(f"{entry.path} installed, but its log entry: {exc}") from exc
        return result

    async def install(
        self, category: str, entry: ManifestEntry, sources: FallbackSources
    ) -> TransferResult:
        """Fetch and install `entry` from `sources` without a WAL entry (recovery uses this)."""
        root = self.catalog.root(category)
        result = await sources.run(
            entry.path, lambda peer: self._fetch_from(peer, category, entry, root)
        )
        final = dest_path(root, entry.path)
        info = await asyncio.to_thread(os.stat, final)
        if info.st_size == entry.size and info.st_mtime_ns == entry.mtime_ns:
            await self.catalog.cache(category).record(entry, info)
        return result

    async def _fetch_from(
        self, peer: PeerRef, category: str, entry: ManifestEntry, root: Path
    ) -> TransferResult:
        """Try each of the peer's transports in order, each through its breaker, retrying a
        network failure or a corrupt piece up to `retries` times."""
        last: BaseException = FileTransferError(f"{peer.node_id}: no usable transport")
        for name in peer.transports:
            transport = self._transports.get(name)
            if transport is None:
                continue
            breaker = self._breakers.breaker_for(peer.node_id, name)
            for attempt in range(self.options.retries + 1):
                refusal: FileSyncError | None = None
                try:
                    async with breaker:
                        try:
                            return await transport.fetch(peer, category, entry, root)
                        except RETRYABLE:
                            raise
                        except FileSyncError as exc:
                            refusal = exc  # the peer said no, or this node failed: no fault
                except CircuitOpenError as exc:
                    last = exc
                    break
                except RETRYABLE as exc:
                    last = exc
                    if self._metrics is not None:
                        self._metrics.record_request_error(peer.node_id)
                    self._warn(
                        f"fetch:{peer.node_id}",
                        "%s/%s from %s over %s (try %d): %s",
                        category,
                        entry.path,
                        peer.node_id,
                        name,
                        attempt + 1,
                        exc,
                    )
                    if attempt < self.options.retries:
                        await asyncio.sleep(self.options.retry_delay_s * (attempt + 1))
                    continue
                if refusal is not None:
                    raise refusal
        raise last

    async def full_cluster_sync(
        self,
        categories: Sequence[str] | None = None,
        timeout_s: float | None = None,
        peers: Sequence[PeerRef] | None = None,
    ) -> ClusterSyncStats:
        """Sync every category (default: all file categories) from `peers` (default: every
        peer the peers function returns), within `timeout_s` (default sync_s); categories not
        reached in time count as failed for every peer."""
        chosen = list(categories) if categories is not None else list(self.catalog.categories)
        peers = await self._peers(peers)
        per_category: dict[str, SyncStats] = {}
        failed: set[str] = set()
        try:
            async with asyncio.timeout(timeout_s or self.options.timeouts.sync_s):
                for category in chosen:
                    stats, bad = await self._sync_category(category, peers)
                    per_category[category] = stats
                    failed |= bad
        except TimeoutError:
            for category in chosen:
                per_category.setdefault(category, SyncStats(errors=("timed out",)))
            failed |= {peer.node_id for peer in peers}
        return ClusterSyncStats(
            total_files=sum(s.files_transferred for s in per_category.values()),
            total_bytes=sum(s.bytes_transferred for s in per_category.values()),
            nodes_synced=len({peer.node_id for peer in peers} - failed),
            failed_nodes=tuple(sorted(failed)),
            category_stats=per_category,
            node_stats=node_totals(per_category),
        )

    async def pull_file(
        self, category: str, path: str, content_hash: str, source: PeerRef
    ) -> TransferResult | None:
        """Pull version `content_hash` of `path` from `source` now (a push from it); None when
        this node already has it. FileChangedError when the source no longer has it."""
        if await local_entry(self.catalog, category, path, content_hash) is not None:
            return None
        async with self._breakers.breaker_for(source.node_id, "http"):
            page = await self.http.manifest_page(
                source, category, piece_size=self.catalog.piece_size, path=path
            )
        entry = page.entries[0] if page.entries else None
        if entry is None or entry.hash != content_hash:
            raise FileChangedError(f"{source.node_id}: {path} is no longer that version", 409)
        plan = FallbackSources(source, (), self.options.timeouts.sync_s)
        return await self.fetch(category, entry, plan)

    async def push_file(
        self, local_path: Path | str, category: str, rel_path: str, peer: PeerRef
    ) -> TransferResult | None:
        """Make `peer` hold this file: placed at `rel_path` of `category` here first (copied in
        atomically when `local_path` is elsewhere), then the peer is asked to pull it from us
        (`POST /v1/sync/{category}/pull`, carrying the plan's fence when this coordinator has a
        fence source: a peer under a newer plan refuses it with 409 `stale_fence`). Returns the
        peer's transfer, None if it had it."""
        entry = await install_copy(self.catalog, Path(local_path), category, rel_path)
        headers = dict(self._fence()) if self._fence is not None else {}
        refusal: FileTransferError | None = None
        async with self._breakers.breaker_for(peer.node_id, "http"):
            try:
                answer = await self.http.request_pull(
                    peer, category, rel_path, entry.hash, self.self_peer, headers=headers
                )
            except FileTransferError as exc:
                if exc.status is None or exc.status >= 500:
                    raise
                refusal = exc  # the peer answered no (409 stale_fence): not a fault of it
        if refusal is not None:
            raise refusal
        result = answer.get("result")
        if not isinstance(result, dict):
            return None
        try:
            return TransferResult(**result)
        except TypeError as exc:
            raise FileTransferError(f"{peer.node_id}: malformed pull answer: {exc}") from exc
