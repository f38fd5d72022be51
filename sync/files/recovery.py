"""Crash recovery of file transfers (resume or clean up each pending `sync_started` entry, sweep
stale temp files) and the local steps of a push (place a copy of a file in its category).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from health import BreakerRegistry, CircuitOpenError
from sync.errors import FileSyncError, PathRefusedError, UnknownCategoryError
from sync.files.catalog import FileCatalog
from sync.files.manifest import ManifestEntry, digest_of_fd
from sync.files.plan import FallbackSources, SyncOptions
from sync.guards import (
    check_free_space,
    dest_path,
    open_inside,
    partial_name,
    sweep_stale_files,
    temp_name,
)
from sync.transports.http import HttpTransport
from sync.transports.partial import install_file, make_directories
from sync.transports.protocol import PeerRef, TransferResult
from wal import SYNC_STARTED, RecoveryHandler, WalEntry, WriteAheadLog

Install = Callable[[str, ManifestEntry, FallbackSources], Awaitable[TransferResult]]
"""install(category, entry, sources): fetch and install one file without a WAL entry."""

logger = logging.getLogger(__name__)


def partial_size(directory: Path, content_hash: str) -> int:
    """Bytes already in the partial file of `content_hash` (0 when there is none). Blocking."""
    try:
        return (directory / partial_name(content_hash)).stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        return 0


def remove_partial(directory: Path, content_hash: str) -> None:
    (directory / partial_name(content_hash)).unlink(missing_ok=True)


async def local_entry(
    catalog: FileCatalog, category: str, path: str, content_hash: str | None = None
) -> ManifestEntry | None:
    """This node's entry of `path` (hashed now if the cache is stale), when it exists and, if
    `content_hash` is given, has that hash."""
    try:
        fd, _ = await asyncio.to_thread(open_inside, catalog.root(category), path)
    except (FileNotFoundError, NotADirectoryError, PathRefusedError):
        return None
    try:
        entry = await catalog.cache(category).entry_for_open_file(path, fd)
    finally:
        os.close(fd)
    if entry is None or (content_hash is not None and entry.hash != content_hash):
        return None
    return entry


def _copy_into_place(
    source: Path, root: Path, final: Path, rel_path: str, piece_size: int
) -> tuple[ManifestEntry, os.stat_result]:
    make_directories(root, final.parent)
    temp = final.parent / temp_name(final.name)
    try:
        with source.open("rb") as src, temp.open("xb") as dst:
            mtime_ns = os.fstat(src.fileno()).st_mtime_ns
            shutil.copyfileobj(src, dst, 1 << 20)
        fd = os.open(temp, os.O_RDWR | os.O_CLOEXEC)
        try:
            size, digest, pieces = digest_of_fd(fd, piece_size)
            entry = ManifestEntry(rel_path, size, mtime_ns, digest, pieces, piece_size)
            info = install_file(temp, final, entry, fd, verified=True)
        finally:
            os.close(fd)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return entry, info


def _same_file(path: Path, other: Path) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


async def install_copy(
    catalog: FileCatalog, local_path: Path, category: str, rel_path: str
) -> ManifestEntry:
    """The entry of `rel_path` in `category`, first copying `local_path` there (temp file,
    fsync, atomic rename) unless it already is that file."""
    root = catalog.root(category)
    final = dest_path(root, rel_path)
    if await asyncio.to_thread(_same_file, local_path, final):
        present = await local_entry(catalog, category, rel_path)
        if present is None:
            raise FileSyncError(f"{final} is missing or being written")
        return present
    try:
        entry, info = await asyncio.to_thread(
            _copy_into_place, local_path, root, final, rel_path, catalog.piece_size
        )
    except OSError as exc:
        raise FileSyncError(f"cannot copy {local_path} to {final}: {exc}") from exc
    await catalog.cache(category).record(entry, info)
    return entry


class FileRecovery:
    """Crash recovery of one node's file transfers: what a SyncCoordinator hands it, explicitly
    (no reference back to the coordinator)."""

    def __init__(
        self,
        catalog: FileCatalog,
        http: HttpTransport,
        wal: WriteAheadLog | None,
        breakers: BreakerRegistry,
        options: SyncOptions,
        install: Install,
    ) -> None:
        self._catalog = catalog
        self._http = http
        self._wal = wal
        self._breakers = breakers
        self._options = options
        self._install = install

    def handlers(self) -> dict[str, RecoveryHandler]:
        return {SYNC_STARTED: self.resume}

    async def sweep(self) -> None:
        """Delete stale temp files, and partial files that are old and that no pending
        `sync_started` entry will resume."""
        keep: set[str] = set()
        if self._wal is not None:
            for entry in await self._wal.pending(SYNC_STARTED):
                digest = entry.payload.get("hash")
                if isinstance(digest, str):
                    keep.add(digest)
        catalog = self._catalog
        for category in catalog.categories:
            await asyncio.to_thread(
                sweep_stale_files,
                catalog.root(category),
                frozenset(keep),
                self._options.partial_max_age_s,
            )

    async def _settle_batch(self, wal: WriteAheadLog, wal_entry: WalEntry) -> None:
        """An interrupted batch: each of its files is either in place (complete and verified:
        placed by an atomic rename after its fsync) or absent, so nothing is resumed; the
        entry is committed when every file is in place, else rolled back naming how many are
        missing (the sync loop pulls them)."""
        payload = wal_entry.payload
        try:
            category = payload["category"]
            files = [(item["path"], item["hash"]) for item in payload["batch"]]
            self._catalog.root(category)
        except (KeyError, TypeError, UnknownCategoryError) as exc:
            await wal.rollback(wal_entry.id, reason=f"cannot settle the batch: {exc}")
            return
        missing = 0
        for path, digest in files:
            if await local_entry(self._catalog, category, path, digest) is None:
                missing += 1
        if missing:
            reason = f"interrupted batch: {missing} of {len(files)} files not installed"
            logger.info("transfer %s of %s: %s", wal_entry.id, category, reason)
            await wal.rollback(wal_entry.id, reason=reason)
        else:
            logger.info("batch %s of %s had finished before the restart", wal_entry.id, category)

    async def resume(self, wal_entry: WalEntry) -> TransferResult | None:
        """Finish one interrupted transfer: done if the file is already in place; resumed
        from its partial file if the peer still has that version (the transfer is returned);
        otherwise the partial is removed (superseded) or kept for the sync loop (peer
        unreachable) and the entry is rolled back with the reason."""
        wal = self._wal
        if wal is None:
            raise FileSyncError("recovery of transfers needs the WAL they were logged in")
        payload = wal_entry.payload
        if "batch" in payload:
            await self._settle_batch(wal, wal_entry)
            return None
        try:
            category, path, digest = payload["category"], payload["path"], payload["hash"]
            peer = PeerRef.from_json(payload["peer"])
            root = self._catalog.root(category)
            final = dest_path(root, path)
        except (KeyError, TypeError, ValueError, UnknownCategoryError) as exc:
            await wal.rollback(wal_entry.id, reason=f"cannot resume: {exc}")
            return None
        if await local_entry(self._catalog, category, path, digest) is not None:
            logger.info(
                "transfer %s of %s/%s had finished before the restart", wal_entry.id, category, path
            )
            return None
        try:
            async with self._breakers.breaker_for(peer.node_id, "http"):
                page = await self._http.manifest_page(
                    peer, category, piece_size=self._catalog.piece_size, path=path
                )
            remote = page.entries[0] if page.entries else None
            if remote is None or remote.hash != digest:
                await asyncio.to_thread(remove_partial, final.parent, digest)
                await wal.rollback(wal_entry.id, reason="superseded: the peer has another version")
                return None
            present = await asyncio.to_thread(partial_size, final.parent, digest)
            await asyncio.to_thread(
                check_free_space, root, remote.size - present, self._options.reserve
            )
            plan = FallbackSources(peer, (), self._options.timeouts.sync_s)
            result = await self._install(category, remote, plan)
        except (FileSyncError, CircuitOpenError) as exc:
            logger.warning(
                "transfer %s of %s/%s not resumed: %s", wal_entry.id, category, path, exc
            )
            await wal.rollback(wal_entry.id, reason=f"not resumed: {exc}")
            return None
        logger.info(
            "transfer %s of %s/%s resumed and installed (%d bytes reused)",
            wal_entry.id,
            category,
            path,
            result.resumed_bytes,
        )
        return result
