"""Decisions of file sync, without I/O: which version of each file wins, what to pull from
whom, and the order of sources to try (FallbackSources); plus the options and results of a
sync."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from config import NodeSettings, Timeouts
from health import CircuitOpenError
from sync.errors import (
    AllSourcesFailedError,
    FileSyncError,
    InsufficientSpaceError,
    TransferBusyError,
)
from sync.files.manifest import ManifestEntry
from sync.guards import SpaceReserve
from sync.transports.protocol import PeerRef

logger = logging.getLogger(__name__)

T = TypeVar("T")
LOCAL_ERRORS = (InsufficientSpaceError, TransferBusyError)
"""Errors of this node, not of a source: trying another source would not help."""


@dataclass(frozen=True)
class SyncOptions:
    """Tuning of a coordinator. `retries`: extra tries of one peer and transport after a
    network failure or a corrupt piece. A file of at least `large_file_bytes` waits for one of
    `max_large_transfers` slots; smaller ones for one of `max_small_transfers`. Files of at
    most `batch_file_bytes` (0: never) from one peer are pulled together, up to
    `batch_max_files` files and `batch_max_bytes` bytes per request and WAL entry."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    retries: int = 2
    retry_delay_s: float = 0.5
    max_large_transfers: int = 1
    max_small_transfers: int = 4
    large_file_bytes: int = 64 << 20
    reserve: SpaceReserve = field(default_factory=SpaceReserve)
    partial_max_age_s: float = 86400.0
    batch_file_bytes: int = 1 << 20
    batch_max_files: int = 500
    batch_max_bytes: int = 32 << 20

    @classmethod
    def from_settings(cls, settings: NodeSettings, **overrides: object) -> SyncOptions:
        return cls(timeouts=settings.timeouts, **overrides)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NodeSyncStats:
    """What came from one peer: files installed from it, their bytes, and its failures."""

    files_transferred: int = 0
    bytes_transferred: int = 0
    errors: tuple[str, ...] = ()

    def __add__(self, other: NodeSyncStats) -> NodeSyncStats:
        return NodeSyncStats(
            self.files_transferred + other.files_transferred,
            self.bytes_transferred + other.bytes_transferred,
            self.errors + other.errors,
        )


@dataclass(frozen=True)
class SyncStats:
    """What one sync of one category did. `errors` holds one line per failure; `nodes` the
    same per peer (a failure of this node's own, like a full disk, is in `errors` only).
    For a category whose deletions propagate: `deleted` local copies removed by tombstones;
    `stale_beyond_tombstone_ttl` when this node had not synced it for longer than the
    tombstone TTL, and then `resurrected`, the files here that no peer has (deletions this
    node may have missed, which its peers will copy back)."""

    files_transferred: int = 0
    bytes_transferred: int = 0
    duration_seconds: float = 0.0
    errors: tuple[str, ...] = ()
    nodes: Mapping[str, NodeSyncStats] = field(default_factory=dict)
    deleted: int = 0
    stale_beyond_tombstone_ttl: bool = False
    resurrected: int = 0


@dataclass(frozen=True)
class RecordSyncStats:
    """What one pull of one record store from every peer did."""

    pulled: int = 0
    inserted: int = 0
    duplicates: int = 0
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSyncStats:
    """A sync of several categories from every peer: totals, the peers everything came from
    (`nodes_synced`, a count) and those that failed (`failed_nodes`, node ids); per file
    category `category_stats`, per record store `record_stats`, per peer `node_stats` (files
    of every category)."""

    total_files: int
    total_bytes: int
    nodes_synced: int
    failed_nodes: tuple[str, ...]
    category_stats: Mapping[str, SyncStats] = field(default_factory=dict)
    record_stats: Mapping[str, RecordSyncStats] = field(default_factory=dict)
    node_stats: Mapping[str, NodeSyncStats] = field(default_factory=dict)


def node_totals(per_category: Mapping[str, SyncStats]) -> dict[str, NodeSyncStats]:
    """Per peer, the sum over categories of what came from it."""
    totals: dict[str, NodeSyncStats] = {}
    for stats in per_category.values():
        for node, counts in stats.nodes.items():
            totals[node] = totals.get(node, NodeSyncStats()) + counts
    return dict(sorted(totals.items()))


@dataclass
class SyncProgress:
    """Transfers planned and finished since the last `reset()` (a file counts as done when it
    is installed or failed); the daemon shows it while a sync runs. Owned by the coordinator."""

    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0

    def reset(self) -> None:
        self.files_total = self.bytes_total = self.files_done = self.bytes_done = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "files_total": self.files_total,
            "bytes_total": self.bytes_total,
            "files_done": self.files_done,
            "bytes_done": self.bytes_done,
        }


@dataclass(frozen=True)
class PullItem:
    """One file to pull: the winning version and the peers that hold exactly it, best first.
    `replaces` is the hash of the older local version, None for a new file."""

    entry: ManifestEntry
    sources: tuple[PeerRef, ...]
    replaces: str | None = None


def version_key(entry: ManifestEntry) -> tuple[int, str]:
    """Newest wins: the later mtime, then (a tie between different contents) the larger hash,
    so every node picks the same version."""
    return (entry.mtime_ns, entry.hash)


def plan_pulls(
    local: Mapping[str, ManifestEntry],
    remotes: Sequence[tuple[PeerRef, Iterable[ManifestEntry]]],
) -> list[PullItem]:
    """The files to pull, by path: each path's newest version among the peers, when this node
    lacks the path or holds an older version. Nothing is deleted here (tombstones.py)."""
    candidates: dict[str, list[tuple[ManifestEntry, PeerRef]]] = {}
    get = local.get
    for peer, entries in remotes:
        for entry in entries:
            mine = get(entry.path)
            if mine is not None and (
                mine.hash == entry.hash or version_key(mine) >= version_key(entry)
            ):
                continue
            candidates.setdefault(entry.path, []).append((entry, peer))
    items: list[PullItem] = []
    for path in sorted(candidates):
        offers = candidates[path]
        if len(offers) == 1:  # one peer has it (the sync of one source): nothing to choose
            winner, holder = offers[0]
            holders: tuple[PeerRef, ...] = (holder,)
        else:
            newest = max(version_key(entry) for entry, _ in offers)
            winner = next(entry for entry, _ in offers if version_key(entry) == newest)
            holders = tuple(peer for entry, peer in offers if entry.hash == winner.hash)
        mine = get(path)
        items.append(PullItem(winner, holders, mine.hash if mine is not None else None))
    return items


@dataclass(frozen=True)
class FallbackSources:
    """Where to get one file: the primary host, then each fallback, all within `timeout_s`."""

    primary: PeerRef
    fallbacks: tuple[PeerRef, ...] = ()
    timeout_s: float = 300.0

    @property
    def sources(self) -> tuple[PeerRef, ...]:
        """Primary then fallbacks, each node once."""
        seen: set[str] = set()
        ordered: list[PeerRef] = []
        for peer in (self.primary, *self.fallbacks):
            if peer.node_id not in seen:
                seen.add(peer.node_id)
                ordered.append(peer)
        return tuple(ordered)

    async def run(self, path: str, attempt: Callable[[PeerRef], Awaitable[T]]) -> T:
        """`attempt(peer)` for each source in order until one succeeds. A source's failure
        (FileSyncError, CircuitOpenError) moves on; this node's own errors (no space, busy)
        stop at once. AllSourcesFailedError when none succeeds or time runs out."""
        errors: list[tuple[str, BaseException]] = []
        current = self.primary
        try:
            async with asyncio.timeout(self.timeout_s):
                for peer in self.sources:
                    current = peer
                    try:
                        return await attempt(peer)
                    except LOCAL_ERRORS:
                        raise
                    except (FileSyncError, CircuitOpenError) as exc:
                        errors.append((peer.node_id, exc))
                        logger.debug("%s from %s failed: %s", path, peer.node_id, exc)
        except TimeoutError as exc:
            errors.append((current.node_id, exc))
            raise AllSourcesFailedError(path, errors) from exc
        raise AllSourcesFailedError(path, errors)
