"""The files of committed steps on this node: which are here and match their committed hash,
and getting the others from the nodes that hold them through the sync engine (verified pieces,
several holders at once, the swarm's fan-out for large files, WAL-logged and resumed after a
crash): the same transfers as any synced file, no second transfer stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from health import BreakerRegistry, CircuitOpenError
from node.errors import CheckpointsError
from node.locks.checkpoints import CheckpointFile
from node.sync_service import SyncService
from sync import (
    CHECKPOINTS,
    FallbackSources,
    FileCatalog,
    FileSyncError,
    ManifestEntry,
    PeerRef,
    open_inside,
)

log = logging.getLogger(__name__)

METADATA = ".metadata"
METADATA_COPY = "metadata"
"""DCP's metadata file, and the name its hard link is reported and served under (the file
routes refuse names that begin with a dot); shoal._checkpoint_files names them alike."""
FETCHES_AT_ONCE = 4


@dataclass(frozen=True)
class Fetched:
    """What a fetch brought: files and bytes."""

    files: int = 0
    size_bytes: int = 0


class StepFiles:
    """This node's copies of checkpoint files, kept by its sync service's catalog."""

    def __init__(
        self, sync: SyncService, breakers: BreakerRegistry, *, at_once: int = FETCHES_AT_ONCE
    ) -> None:
        self._sync = sync
        self._breakers = breakers
        self._at_once = at_once

    @property
    def root(self) -> Path:
        return self.catalog().root(CHECKPOINTS)

    def catalog(self) -> FileCatalog:
        catalog = self._sync.catalog
        if catalog is None:
            raise CheckpointsError(503, "sync_not_running", "the sync service is not running")
        return catalog

    async def has(self, item: CheckpointFile) -> bool:
        """True when `item` is here with its committed size and hash (hashed only when the
        manifest cache has not seen this version of the file)."""
        catalog = self.catalog()
        try:
            fd, info = await asyncio.to_thread(open_inside, catalog.root(CHECKPOINTS), item.path)
        except (OSError, FileSyncError):
            return False
        try:
            if info.st_size != item.size:
                return False
            entry = await catalog.cache(CHECKPOINTS).entry_for_open_file(item.path, fd)
        finally:
            os.close(fd)
        return entry is not None and entry.hash == item.hash

    async def missing(self, files: Sequence[CheckpointFile]) -> list[CheckpointFile]:
        """The files of `files` not here as committed."""
        present = await asyncio.gather(*(self.has(item) for item in files))
        return [item for item, here in zip(files, present, strict=True) if not here]

    async def fetch(self, wanted: Sequence[tuple[CheckpointFile, Sequence[str]]]) -> Fetched:
        """Fetch each file from the alive nodes of its holders (several files at once, each
        file's first source rotating over its holders so they share the load; the others are
        its fallbacks). Files of the same content one after the other: a transfer's partial
        file is named by its content hash in its directory. CheckpointsError 503 naming the
        files no holder delivered."""
        limit = asyncio.Semaphore(self._at_once)
        failures: list[str] = []
        alike: dict[str, list[tuple[int, CheckpointFile, Sequence[str]]]] = {}
        for index, (item, holders) in enumerate(wanted):
            alike.setdefault(item.hash, []).append((index, item, holders))

        async def in_turn(group: list[tuple[int, CheckpointFile, Sequence[str]]]) -> int:
            size = 0
            for index, item, holders in group:
                async with limit:
                    try:
                        size += await self._fetch_one(item, self._sources(holders, index))
                    except CheckpointsError as exc:
                        failures.append(exc.reason)
            return size

        sizes = await asyncio.gather(*(in_turn(group) for group in alike.values()))
        if failures:
            raise CheckpointsError(
                503,
                "fetch_failed",
                f"{len(failures)} of {len(wanted)} checkpoint files not fetched: "
                + "; ".join(failures[:3]),
            )
        return Fetched(len(wanted), sum(sizes))

    def _sources(self, holders: Sequence[str], index: int) -> list[PeerRef]:
        alive = {peer.node_id: peer for peer in self._sync.alive_peers()}
        ordered = [alive[node] for node in holders if node in alive]
        if not ordered:
            return []
        shift = index % len(ordered)
        return ordered[shift:] + ordered[:shift]

    async def _fetch_one(self, item: CheckpointFile, sources: Sequence[PeerRef]) -> int:
        if not sources:
            raise CheckpointsError(503, "no_holder", f"{item.path}: no alive node holds it")
        coordinator = self._sync.coordinator
        if coordinator is None:
            raise CheckpointsError(503, "sync_not_running", "the sync service is not running")
        errors: list[str] = []
        for start, peer in enumerate(sources):
            try:
                entry = await self._entry_at(peer, item)
            except (FileSyncError, CircuitOpenError) as exc:
                errors.append(f"{peer.node_id}: {exc}")
                continue
            if entry is None:
                errors.append(f"{peer.node_id}: holds another version")
                continue
            plan = FallbackSources(
                peer, tuple(sources[start + 1 :]), coordinator.options.timeouts.sync_s
            )
            try:
                await coordinator.fetch(CHECKPOINTS, entry, plan)
            except (FileSyncError, CircuitOpenError) as exc:
                errors.append(f"{peer.node_id}: {exc}")
                break
            return item.size
        raise CheckpointsError(503, "fetch_failed", f"{item.path}: {'; '.join(errors)}")

    async def _entry_at(self, peer: PeerRef, item: CheckpointFile) -> ManifestEntry | None:
        """`peer`'s manifest entry of the file when it holds the committed version, else None."""
        coordinator = self._sync.coordinator
        assert coordinator is not None
        catalog = self.catalog()
        async with self._breakers.breaker_for(peer.node_id, "http"):
            page = await coordinator.http.manifest_page(
                peer, CHECKPOINTS, piece_size=catalog.piece_size, path=item.path
            )
        entry = page.entries[0] if page.entries else None
        if entry is None or entry.hash != item.hash or entry.size != item.size:
            return None
        return entry

    def restore_metadata(self, directory: str) -> None:
        """Give the step's directory DCP's metadata file, linked from its served copy (a node
        that fetched the step has only the copy). Blocking."""
        path = self.root / directory
        if (path / METADATA).is_file() or not (path / METADATA_COPY).is_file():
            return
        temporary = path / f"{METADATA}.shoal-link"
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        os.link(path / METADATA_COPY, temporary)
        os.replace(temporary, path / METADATA)
