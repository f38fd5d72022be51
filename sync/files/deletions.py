"""One sync round's deletions for a category whose deletions propagate: store the peers'
tombstones, delete the local copies they name, and say when this node was away longer than
tombstones are kept (its files may be deletions it missed, which its peers will copy back).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from config import fsync_directory
from sync.errors import FileSyncError
from sync.files.catalog import FileCatalog
from sync.files.manifest import ManifestEntry
from sync.files.manifest_cache import Listing, StatKey, stat_key
from sync.files.tombstones import DeletionPlan, Tombstone, plan_deletions
from sync.guards import dest_path
from sync.transports.protocol import PeerRef

logger = logging.getLogger(__name__)

SHOWN_PATHS = 5
"""Paths named in the warning of a node away longer than the tombstone TTL."""


@dataclass(frozen=True)
class DeletionRound:
    """What the tombstones did in one round of one category: the peers' entries minus deleted
    versions (what may be pulled), local copies deleted, and whether this node last synced
    longer ago than the TTL (`stale_beyond_tombstone_ttl`), with the files it holds that none
    of its peers has (`resurrected`: maybe deleted elsewhere, and now copied back)."""

    remotes: list[tuple[PeerRef, tuple[ManifestEntry, ...]]]
    deleted: int = 0
    stale_beyond_tombstone_ttl: bool = False
    resurrected: tuple[str, ...] = ()


def delete_copy(root: Path, path: str, expected: StatKey) -> bool:
    """Unlink `path` under `root` if it is still the file hashed at `expected` (size, mtime,
    inode), then fsync its directory. False when it changed or is gone. Blocking."""
    final = dest_path(root, path)
    try:
        info = os.stat(final, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat_key(info) != expected:
        return False
    try:
        os.unlink(final)
    except FileNotFoundError:
        return False
    fsync_directory(final.parent)
    return True


async def apply_deletions(
    catalog: FileCatalog,
    category: str,
    node_id: str,
    local: Listing,
    remotes: Sequence[tuple[PeerRef, tuple[ManifestEntry, ...], tuple[Tombstone, ...]]],
) -> DeletionRound:
    """Weigh this node's and the listed peers' tombstones against the local files
    (plan_deletions), store the peers' durably first, then delete the local copies they kill;
    a crash in between leaves the tombstone, which deletes the copy in the next round. With
    at least one peer listed, record that this category synced now."""
    store = catalog.tombstones
    if store is None:
        raise FileSyncError(f"category {category} does not propagate deletions")
    now_ns = store.now_ns()
    last = store.last_sync_ns(category)
    stale = last is not None and now_ns - last > store.ttl_s * 1e9
    await store.purge_expired(category)
    held = store.held(category)
    if held or any(tombs for _, _, tombs in remotes):
        mine = dict(zip(local.paths, local.entries, strict=True))
    else:
        mine = {}  # no tombstone to weigh: spare a map of every file
    plan: DeletionPlan = plan_deletions(
        mine,
        held,
        (tomb for _, _, tombs in remotes for tomb in tombs),
        now_ns=now_ns,
        ttl_s=store.ttl_s,
    )
    await store.change(category, plan.adopt, plan.clear)
    deleted = await _delete_copies(catalog, category, node_id, plan)
    filtered = [(peer, plan.surviving(entries)) for peer, entries, _ in remotes]
    resurrected: tuple[str, ...] = ()
    if stale and remotes:
        assert last is not None
        resurrected = _resurrected(local, filtered, plan)
        _warn_resurrected(node_id, category, (now_ns - last) / 1e9, store.ttl_s, resurrected)
    if remotes:
        await store.set_last_sync(category, now_ns)
    return DeletionRound(filtered, deleted, stale and bool(remotes), resurrected)


async def _delete_copies(
    catalog: FileCatalog, category: str, node_id: str, plan: DeletionPlan
) -> int:
    """Delete the local copies the plan kills (each only if it is still the version the
    tombstone names); how many went. A copy this node may not delete is logged and kept."""
    deleted = 0
    cache = catalog.cache(category)
    root = catalog.root(category)
    for entry, tomb in plan.delete:
        keyed = cache.lookup_keyed(entry.path)
        if keyed is None or keyed[0].hash != entry.hash:
            continue
        try:
            gone = await asyncio.to_thread(delete_copy, root, entry.path, keyed[1])
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR):
                raise FileSyncError(f"cannot delete {category}/{entry.path}: {exc}") from exc
            logger.warning("node %s: cannot delete %s/%s: %s", node_id, category, entry.path, exc)
            continue
        if gone:
            deleted += 1
            logger.info(
                "node %s: deleted %s/%s (deleted on %s)",
                node_id,
                category,
                entry.path,
                tomb.node_id,
            )
    return deleted


def _resurrected(
    local: Listing,
    filtered: Sequence[tuple[PeerRef, tuple[ManifestEntry, ...]]],
    plan: DeletionPlan,
) -> tuple[str, ...]:
    """The local files no peer holds and no tombstone kills: maybe deletions this node missed."""
    held_by_peers = {entry.path for _, entries in filtered for entry in entries}
    killed = {entry.path for entry, _ in plan.delete}
    return tuple(path for path in local.paths if path not in held_by_peers and path not in killed)


def _warn_resurrected(
    node_id: str, category: str, since_s: float, ttl_s: float, resurrected: tuple[str, ...]
) -> None:
    logger.warning(
        "node %s: %s last synced %.0f s ago, longer than tombstone_ttl_s %.0f: deletions "
        "made meanwhile are forgotten, and %d file(s) here that no peer has (%s) may be "
        "such deletions, which peers will now copy back; delete them here if they were "
        "deleted elsewhere",
        node_id,
        category,
        since_s,
        ttl_s,
        len(resurrected),
        ", ".join(resurrected[:SHOWN_PATHS]) + (", ..." if len(resurrected) > SHOWN_PATHS else ""),
    )
