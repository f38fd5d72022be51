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

from health import BreakerRegistry, CircuitOpenError, NodeMetrics
from sync.files.batch import MAX_BATCH_FILE_BYTES
from sync.files.catalog import FileCatalog
from sync.files.deletions import DeletionRound, apply_deletions
from sync.files.download import RECEIVED
from sync.files.errors import (
    AllSourcesFailedError,
    ContentMismatchError,
    FileChangedError,
    FileSyncError,
    FileTransferError,
)
from sync.files.manifest import ManifestEntry
from sync.files.plan import (
    ClusterSyncStats,
    FallbackSources,
    NodeSyncStats,
    PullItem,
    SyncOptions,
    SyncProgress,
    SyncStats,
    node_totals,
    plan_pulls,
)
from sync.files.recovery import FileRecovery, install_copy, local_entry, partial_size
from sync.files.tombstones import Tombstone
from sync.guards import check_free_space, dest_path
from sync.transports.http import HttpTransport, RemoteManifest
from sync.transports.protocol import PeerRef, TransferResult, Transport
from wal import SYNC_STARTED, WalError, WriteAheadLog

__all__ = ["FenceHeaders", "PeersFn", "SyncCoordinator", "SyncOptions"]

logger = logging.getLogger(__name__)

PeersFn = Callable[[], Sequence[PeerRef] | Awaitable[Sequence[PeerRef]]]
FenceHeaders = Callable[[], Mapping[str, str]]
"""The headers naming the plan this node acts under (`X-Shoal-Fence: term.version`), sent with
each request it makes because of the plan; empty while it applies none."""
RETRYABLE = (ContentMismatchError, FileTransferError)


class SyncCoordinator:
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
        self._breakers = breakers if breakers is not None else BreakerRegistry()
        self._metrics = metrics
        self._transports: dict[str, Transport] = dict(transports or {"http": http})
        self._peers_fn = peers_fn
        self._fence = fence
        self._large = asyncio.Semaphore(self.options.max_large_transfers)
        self._small = asyncio.Semaphore(self.options.max_small_transfers)
        self._in_flight: set[tuple[str, str]] = set()
        self._warned: set[str] = set()
        self._recovery = FileRecovery(
            catalog, http, wal, self._breakers, self.options, self.install
        )
        self.last_stats: dict[str, SyncStats] = {}
        self.progress = SyncProgress()
        self._settled: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        self._closed = False

    async def __aenter__(self) -> SyncCoordinator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Remove stale temp files, and partial files no pending WAL entry will resume."""
        await self._recovery.sweep()

    async def close(self) -> None:
        """Refuse new work; idempotent. Transfers in flight belong to their callers' tasks."""
        self._closed = True

    def recovery_handlers(self) -> dict[str, Callable[..., Awaitable[object]]]:
        """Handlers for `wal.recover`: resume (or clean up) each interrupted transfer."""
        return self._recovery.handlers()

    def _warn(self, key: str, message: str, *args: object) -> None:
        """Log a repeated failure once at WARNING, then at DEBUG until it clears."""
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        logger.log(level, "node %s: %s", self.self_peer.node_id, message % args)

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
        if self._closed:
            raise FileSyncError("sync coordinator is closed")
        started = time.monotonic()
        self.catalog.root(category)
        local_id = self.catalog.shared_id(category)
        errors: list[str] = []
        failed: set[str] = set()
        per_node: dict[str, list[str]] = {}  # errors by peer
        node_files: dict[str, tuple[int, int]] = {}
        local_task = asyncio.ensure_future(self.catalog.listing(category))
        try:
            remote_results = await asyncio.gather(
                *(self._list_remote(peer, category) for peer in peers), return_exceptions=True
            )
        except BaseException:
            local_task.cancel()
            await asyncio.gather(local_task, return_exceptions=True)
            raise
        local = await local_task
        remotes: list[tuple[PeerRef, tuple[ManifestEntry, ...]]] = []
        tombstones: list[tuple[Tombstone, ...]] = []
        etags: list[tuple[str, str]] = []
        for peer, remote in zip(peers, remote_results, strict=True):
            if isinstance(remote, asyncio.CancelledError):
                raise remote
            if isinstance(remote, BaseException):
                self._warn(
                    f"manifest:{peer.node_id}", "manifest of %s failed: %s", peer.node_id, remote
                )
                if self._metrics is not None:
                    self._metrics.record_request_error(peer.node_id)
                errors.append(f"{peer.node_id}: manifest: {remote}")
                per_node.setdefault(peer.node_id, []).append(f"manifest: {remote}")
                failed.add(peer.node_id)
                continue
            self._warned.discard(f"manifest:{peer.node_id}")
            if local_id is not None and remote.shared_id == local_id:
                logger.debug("%s shares %s with this node; nothing to copy", peer.node_id, category)
                continue
            remotes.append((peer, remote.entries))
            tombstones.append(remote.tombstones)
            etags.append((peer.node_id, remote.etag))
        deletions = DeletionRound(remotes)
        if self.catalog.propagates(category):
            listed = [(p, e, t) for (p, e), t in zip(remotes, tombstones, strict=True)]
            deletions = await apply_deletions(
                self.catalog, category, self.self_peer.node_id, local, listed
            )
            remotes = deletions.remotes
        settled = (local.etag, tuple(etags))
        if self._settled.get(category) == settled and all(etag for _, etag in etags):
            plan = []  # neither side changed since a sync that found nothing to pull
        else:
            plan = plan_pulls(dict(zip(local.paths, local.entries, strict=True)), remotes)
        if not plan:
            self._settled[category] = settled
        progress = self.progress
        progress.files_total += len(plan)
        progress.bytes_total += sum(item.entry.size for item in plan)
        batches, singles = self._batches(plan)
        outcomes: dict[str, TransferResult | BaseException | None] = {}

        async def tracked(item: PullItem) -> TransferResult | None:
            counted = 0

            def received(count: int) -> None:
                nonlocal counted
                step = min(count, item.entry.size - counted)
                if step > 0:
                    counted += step
                    progress.bytes_done += step

            token = RECEIVED.set(received)
            try:
                return await self._pull_item(category, item.entry, item.sources)
            finally:
                RECEIVED.reset(token)
                progress.files_done += 1
                progress.bytes_done += item.entry.size - counted

        async def one(item: PullItem) -> None:
            try:
                outcomes[item.entry.path] = await tracked(item)
            except Exception as exc:  # counted in the stats below
                outcomes[item.entry.path] = exc

        async def batch(peer: PeerRef, items: list[PullItem]) -> None:
            done = await self._pull_batch(category, peer, items)
            outcomes.update(done)
            await asyncio.gather(*(one(item) for item in items if item.entry.path not in done))

        await asyncio.gather(
            *(batch(peer, items) for peer, items in batches), *(one(item) for item in singles)
        )
        files = transferred = 0
        for item in plan:
            outcome = outcomes.get(item.entry.path)
            if isinstance(outcome, BaseException):
                errors.append(f"{item.entry.path}: {outcome}")
                if isinstance(outcome, AllSourcesFailedError):
                    failed.update(peer for peer, _ in outcome.errors)
                    for peer_id, error in outcome.errors:
                        per_node.setdefault(peer_id, []).append(f"{item.entry.path}: {error}")
            elif outcome is not None:
                files += 1
                transferred += outcome.bytes_transferred
                count, size = node_files.get(outcome.peer, (0, 0))
                node_files[outcome.peer] = (count + 1, size + outcome.bytes_transferred)
        duration = time.monotonic() - started
        if self._metrics is not None:
            self._metrics.observe_sync(category, duration)
        nodes = {
            node: NodeSyncStats(*node_files.get(node, (0, 0)), tuple(per_node.get(node, ())))
            for node in sorted({*node_files, *per_node})
        }
        stats = SyncStats(
            files,
            transferred,
            duration,
            tuple(errors),
            nodes,
            deleted=deletions.deleted,
            stale_beyond_tombstone_ttl=deletions.stale_beyond_tombstone_ttl,
            resurrected=len(deletions.resurrected),
        )
        self.last_stats[category] = stats
        return stats, failed

    def _batches(
        self, plan: list[PullItem]
    ) -> tuple[list[tuple[PeerRef, list[PullItem]]], list[PullItem]]:
        """The items to pull in batches (small files, by their first source), and the rest."""
        options = self.options
        by_peer: dict[str, tuple[PeerRef, list[PullItem]]] = {}
        singles: list[PullItem] = []
        for item in plan:
            primary = item.sources[0]
            if (
                options.batch_file_bytes > 0
                and options.batch_max_files > 1
                and item.entry.size <= min(options.batch_file_bytes, MAX_BATCH_FILE_BYTES)
                and primary.transports[:1] == ("http",)
            ):
                by_peer.setdefault(primary.node_id, (primary, []))[1].append(item)
            else:
                singles.append(item)
        batches: list[tuple[PeerRef, list[PullItem]]] = []
        for peer, items in by_peer.values():
            if len(items) == 1:
                singles.extend(items)
                continue
            current: list[PullItem] = []
            size = 0
            for item in items:
                if current and (
                    len(current) >= options.batch_max_files
                    or size + item.entry.size > options.batch_max_bytes
                ):
                    batches.append((peer, current))
                    current, size = [], 0
                current.append(item)
                size += item.entry.size
            batches.append((peer, current))
        return batches, singles

    async def _pull_batch(
        self, category: str, peer: PeerRef, items: list[PullItem]
    ) -> dict[str, TransferResult | None]:
        """Pull `items` from `peer` in one request under one WAL entry; the outcome of each
        file installed (None: another transfer has it in flight). Files missing from the
        answer failed in the batch: the caller pulls them one by one."""
        done: dict[str, TransferResult | None] = {}
        mine: list[PullItem] = []
        for item in items:
            key = (category, item.entry.path)
            if key in self._in_flight:
                done[item.entry.path] = None
            else:
                self._in_flight.add(key)
                mine.append(item)
        try:
            async with self._small:
                done.update(await self._fetch_batch(category, peer, [i.entry for i in mine]))
        finally:
            for item in mine:
                self._in_flight.discard((category, item.entry.path))
        return done

    async def _fetch_batch(
        self, category: str, peer: PeerRef, entries: list[ManifestEntry]
    ) -> dict[str, TransferResult]:
        root = self.catalog.root(category)
        progress = self.progress
        started = time.monotonic()
        try:
            await asyncio.to_thread(
                check_free_space, root, sum(e.size for e in entries), self.options.reserve
            )
        except FileSyncError as exc:
            logger.debug("batch of %d files not tried: %s", len(entries), exc)
            return {}
        wal_id: int | None = None
        if self._wal is not None:
            payload = {
                "peer": peer.to_json(),
                "category": category,
                "batch": [
                    {"path": e.path, "hash": e.hash, "size": e.size, "mtime_ns": e.mtime_ns}
                    for e in entries
                ],
            }
            try:
                wal_id = await self._wal.append(SYNC_STARTED, payload)
            except WalError as exc:
                raise FileSyncError(f"cannot log a batch of {len(entries)} files: {exc}") from exc
        installed: list[tuple[ManifestEntry, os.stat_result]] = []

        def on_installed(entry: ManifestEntry, info: os.stat_result) -> None:
            installed.append((entry, info))
            progress.files_done += 1
            progress.bytes_done += entry.size

        failure: BaseException | None = None
        try:
            async with self._breakers.breaker_for(peer.node_id, "http"):
                try:
                    results = await self.http.fetch_batch(
                        peer, category, entries, root, on_installed
                    )
                except FileTransferError as exc:
                    if exc.status is None or exc.status >= 500:
                        raise
                    failure = exc  # the peer refused the batch: not a fault of it
        except (FileSyncError, CircuitOpenError) as exc:
            failure = exc
        finally:
            if installed:
                await self.catalog.cache(category).record_many(installed)
        if failure is not None:
            self._warn(f"batch:{peer.node_id}", "batch from %s: %s", peer.node_id, failure)
        if self._wal is not None and wal_id is not None:
            try:
                if failure is None:
                    await self._wal.commit(wal_id)
                else:
                    reason = f"{len(installed)} installed, then {type(failure).__name__}: {failure}"
                    await self._wal.rollback(wal_id, reason=reason)
            except WalError as exc:
                logger.warning("log entry of a batch from %s: %s", peer.node_id, exc)
        if failure is None:
            return {
                path: result
                for path, result in results.items()
                if isinstance(result, TransferResult)
            }
        return {
            entry.path: TransferResult.installed(
                peer,
                self.http.name,
                category,
                entry,
                transferred=entry.size,
                resumed=0,
                started=started,
            )
            for entry, _ in installed
        }

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
        wal_id: int | None = None
        if self._wal is not None:
            payload = {
                "peer": sources.primary.to_json(),
                "category": category,
                "path": entry.path,
                "hash": entry.hash,
                "size": entry.size,
                "mtime_ns": entry.mtime_ns,
            }
            try:
                wal_id = await self._wal.append(SYNC_STARTED, payload)
            except WalError as exc:
                raise FileSyncError(f"cannot log the transfer of {entry.path}: {exc}") from exc
        try:
            result = await self.install(category, entry, sources)
        except Exception as exc:
            if self._wal is not None and wal_id is not None:
                with contextlib.suppress(Exception):
                    await self._wal.rollback(wal_id, reason=f"{type(exc).__name__}: {exc}")
            raise
        if self._wal is not None and wal_id is not None:
            try:
                await self._wal.commit(wal_id)
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
