"""Small files pulled in batches: one request per peer for many small files under one WAL
entry, installed as they arrive; what a batch misses is pulled one by one by the caller. A
part of SyncCoordinator (engine.py), kept apart to keep each module to one concern."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping

from config.quietlog import QuietLog
from health import BreakerRegistry, CircuitOpenError
from sync.errors import FileSyncError, FileTransferError
from sync.files.catalog import FileCatalog
from sync.files.manifest import ManifestEntry
from sync.files.plan import PullItem, SyncOptions, SyncProgress
from sync.files.rounds import TransferLog, batch_payload
from sync.guards import check_free_space
from sync.transports.http import HttpTransport
from sync.transports.protocol import PeerRef, TransferResult
from wal import WalError

logger = logging.getLogger("sync.files.engine")


class BatchPulls:
    """The batch pulls of a SyncCoordinator, and its once-then-quiet warnings."""

    catalog: FileCatalog
    http: HttpTransport
    self_peer: PeerRef
    options: SyncOptions
    progress: SyncProgress
    _breakers: BreakerRegistry
    _log: TransferLog
    _small: asyncio.Semaphore
    _in_flight: set[tuple[str, str]]
    _quiet: QuietLog

    def _warn(self, key: str, message: str, *args: object) -> None:
        """Log a repeated failure once at WARNING, then at DEBUG until it clears."""
        self._quiet.failed(key, "node %s: %s", self.self_peer.node_id, message % args)

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
        """Fetch `entries` from `peer` in one request under one WAL entry. A full disk skips
        the batch; a refusal or failure keeps what was installed before it (the entry is rolled
        back with that count) and the caller pulls the rest one by one."""
        root = self.catalog.root(category)
        started = time.monotonic()
        try:
            await asyncio.to_thread(
                check_free_space, root, sum(e.size for e in entries), self.options.reserve
            )
        except FileSyncError as exc:
            logger.debug("batch of %d files not tried: %s", len(entries), exc)
            return {}
        wal_id = await self._log.begin(
            batch_payload(peer, category, entries), f"a batch of {len(entries)} files"
        )
        installed: list[tuple[ManifestEntry, os.stat_result]] = []
        try:
            results, failure = await self._batch_request(category, peer, entries, installed)
        finally:
            if installed:
                await self.catalog.cache(category).record_many(installed)
        if failure is not None:
            self._warn(f"batch:{peer.node_id}", "batch from %s: %s", peer.node_id, failure)
        reason = None
        if failure is not None:
            reason = f"{len(installed)} installed, then {type(failure).__name__}: {failure}"
        try:
            await self._log.end(wal_id, reason)
        except WalError as exc:
            logger.warning("log entry of a batch from %s: %s", peer.node_id, exc)
        if failure is None:
            return {p: r for p, r in results.items() if isinstance(r, TransferResult)}
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

    async def _batch_request(
        self,
        category: str,
        peer: PeerRef,
        entries: list[ManifestEntry],
        installed: list[tuple[ManifestEntry, os.stat_result]],
    ) -> tuple[Mapping[str, object], BaseException | None]:
        """The batch request through the peer's breaker: its results, or the failure (a
        refusal below 500 is not held against the peer). Installed files go to `installed`."""
        progress = self.progress

        def on_installed(entry: ManifestEntry, info: os.stat_result) -> None:
            installed.append((entry, info))
            progress.files_done += 1
            progress.bytes_done += entry.size

        root = self.catalog.root(category)
        try:
            async with self._breakers.breaker_for(peer.node_id, "http"):
                try:
                    results = await self.http.fetch_batch(
                        peer, category, entries, root, on_installed
                    )
                except FileTransferError as exc:
                    if exc.status is None or exc.status >= 500:
                        raise
                    return {}, exc  # the peer refused the batch: not a fault of it
        except (FileSyncError, CircuitOpenError) as exc:
            return {}, exc
        return results, None
