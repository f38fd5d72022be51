"""Crash recovery of file transfers (resume or clean up each pending `sync_started` entry, sweep
stale temp files) and the local steps of a push (place a copy of a file in its category).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from health import CircuitOpenError
from sync.files.catalog import FileCatalog
from sync.files.errors import FileSyncError, PathRefusedError, UnknownCategoryError
from sync.files.manifest import ManifestEntry, digest_of_fd
from sync.files.plan import P2PFallbackSync
from sync.guards import (
    check_free_space,
    dest_path,
    open_inside,
    partial_name,
    sweep_stale_files,
    temp_name,
)
from sync.transports.partial import install_file, make_directories
from sync.transports.protocol import PeerRef
from wal import SYNC_STARTED, RecoveryHandler, WalEntry

if TYPE_CHECKING:
    from sync.files.engine import SyncCoordinator

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
    """The recovery side of a SyncCoordinator (which owns it)."""

    def __init__(self, coordinator: SyncCoordinator) -> None:
        self._coordinator = coordinator

    def handlers(self) -> dict[str, RecoveryHandler]:
        return {SYNC_STARTED: self.resume}

    async def sweep(self) -> None:
        """Delete stale temp files, and partial files that are old and that no pending
        `sync_started` entry will resume."""
        coordinator = self._coordinator
        keep: set[str] = set()
        wal = coordinator.wal
        if wal is not None:
            for entry in await wal.pending(SYNC_STARTED):
                digest = entry.payload.get("hash")
                if isinstance(digest, str):
                    keep.add(digest)
        catalog = coordinator.catalog
        for category in catalog.categories:
            await asyncio.to_thread(
                sweep_stale_files,
                catalog.root(category),
                frozenset(keep),
                coordinator.options.partial_max_age_s,
            )

    async def resume(self, wal_entry: WalEntry) -> None:
        """Finish one interrupted transfer: done if the file is already in place; resumed
        from its partial file if the peer still has that version; otherwise the partial is
        removed (superseded) or kept for the sync loop (peer unreachable) and the entry is
        rolled back with the reason."""
        coordinator = self._coordinator
        wal = coordinator.wal
        assert wal is not None
        payload = wal_entry.payload
        try:
            category, path, digest = payload["category"], payload["path"], payload["hash"]
            peer = PeerRef.from_json(payload["peer"])
            root = coordinator.catalog.root(category)
            final = dest_path(root, path)
        except (KeyError, TypeError, ValueError, UnknownCategoryError) as exc:
            await wal.rollback(wal_entry.id, reason=f"cannot resume: {exc}")
            return
        if await local_entry(coordinator.catalog, category, path, digest) is not None:
            logger.info(
                "transfer %s of %s/%s had finished before the restart", wal_entry.id, category, path
            )
            return
        try:
            async with coordinator.breakers.breaker_for(peer.node_id, "http"):
                page = await coordinator.http.manifest_page(
                    peer, category, piece_size=coordinator.catalog.piece_size, path=path
                )
            remote = page.entries[0] if page.entries else None
            if remote is None or remote.hash != digest:
                await asyncio.to_thread(remove_partial, final.parent, digest)
                await wal.rollback(wal_entry.id, reason="superseded: the peer has another version")
                return
            present = await asyncio.to_thread(partial_size, final.parent, digest)
            await asyncio.to_thread(
                check_free_space, root, remote.size - present, coordinator.options.reserve
            )
            plan = P2PFallbackSync(peer, (), coordinator.options.timeouts.sync_s)
            await coordinator.install(category, remote, plan)
        except (FileSyncError, CircuitOpenError) as exc:
            logger.warning(
                "transfer %s of %s/%s not resumed: %s", wal_entry.id, category, path, exc
            )
            await wal.rollback(wal_entry.id, reason=f"not resumed: {exc}")
            return
        logger.info("transfer %s of %s/%s resumed and installed", wal_entry.id, category, path)
