"""One sync round of one category, phase by phase, as plain data the coordinator fills in: what
the peers listed (`ListedRound`), which pulls go in batches (`plan_batches`), how each pull moves
the progress (`tracked_pull`), and the tally of failures and transfers that becomes the round's
`SyncStats` (`RoundTally`), and the WAL entries of its transfers (`TransferLog`). The
coordinator (engine.py) runs the phases.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from sync.errors import AllSourcesFailedError, FileSyncError
from sync.files.batch import MAX_BATCH_FILE_BYTES
from sync.files.deletions import DeletionRound
from sync.files.download import RECEIVED
from sync.files.manifest import ManifestEntry
from sync.files.manifest_cache import Listing
from sync.files.plan import NodeSyncStats, PullItem, SyncOptions, SyncProgress, SyncStats
from sync.files.tombstones import Tombstone
from sync.transports.http import RemoteManifest
from sync.transports.protocol import PeerRef, TransferResult
from wal import SYNC_STARTED, WalError, WriteAheadLog

Outcome = TransferResult | BaseException | None
"""What became of one planned pull: installed, failed, or None (another transfer had it)."""


@dataclass
class RoundTally:
    """Failures and transfers of one round: one line per failure (`errors`), the peers that
    failed (`failed`), each peer's failures (`per_node`) and its files and bytes installed."""

    errors: list[str] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    per_node: dict[str, list[str]] = field(default_factory=dict)
    node_files: dict[str, tuple[int, int]] = field(default_factory=dict)
    files: int = 0
    transferred: int = 0

    def peer_failed(self, peer_id: str, what: str) -> None:
        """Count a failure of `peer_id` (`what` names the step and the error)."""
        self.errors.append(f"{peer_id}: {what}")
        self.per_node.setdefault(peer_id, []).append(what)
        self.failed.add(peer_id)

    def count(self, plan: Sequence[PullItem], outcomes: dict[str, Outcome]) -> None:
        """Add every planned pull's outcome: a failure to the errors (and, when every source
        failed, to each source's failures), an installed file to its peer's files and bytes."""
        for item in plan:
            outcome = outcomes.get(item.entry.path)
            if isinstance(outcome, BaseException):
                self.errors.append(f"{item.entry.path}: {outcome}")
                if isinstance(outcome, AllSourcesFailedError):
                    self.failed.update(peer for peer, _ in outcome.errors)
                    for peer_id, error in outcome.errors:
                        self.per_node.setdefault(peer_id, []).append(f"{item.entry.path}: {error}")
            elif outcome is not None:
                self.files += 1
                self.transferred += outcome.bytes_transferred
                count, size = self.node_files.get(outcome.peer, (0, 0))
                self.node_files[outcome.peer] = (count + 1, size + outcome.bytes_transferred)

    def stats(self, duration_s: float, deletions: DeletionRound) -> SyncStats:
        """The round's statistics, per peer sorted by node id."""
        nodes = {
            node: NodeSyncStats(
                *self.node_files.get(node, (0, 0)), tuple(self.per_node.get(node, ()))
            )
            for node in sorted({*self.node_files, *self.per_node})
        }
        return SyncStats(
            self.files,
            self.transferred,
            duration_s,
            tuple(self.errors),
            nodes,
            deleted=deletions.deleted,
            stale_beyond_tombstone_ttl=deletions.stale_beyond_tombstone_ttl,
            resurrected=len(deletions.resurrected),
        )


@dataclass
class ListedRound:
    """This node's listing and what each peer that answered listed: its entries, tombstones
    and manifest etag (a peer sharing this node's storage is left out: nothing to copy)."""

    local: Listing
    remotes: list[tuple[PeerRef, tuple[ManifestEntry, ...]]] = field(default_factory=list)
    tombstones: list[tuple[Tombstone, ...]] = field(default_factory=list)
    etags: list[tuple[str, str]] = field(default_factory=list)

    def add(self, peer: PeerRef, remote: RemoteManifest) -> None:
        self.remotes.append((peer, remote.entries))
        self.tombstones.append(remote.tombstones)
        self.etags.append((peer.node_id, remote.etag))

    @property
    def settled_key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """Names both sides' content: equal to a round that pulled nothing means nothing
        changed since (valid only when every peer sent an etag: see `all_etags`)."""
        return (self.local.etag, tuple(self.etags))

    @property
    def all_etags(self) -> bool:
        return all(etag for _, etag in self.etags)

    def with_tombstones(
        self,
    ) -> list[tuple[PeerRef, tuple[ManifestEntry, ...], tuple[Tombstone, ...]]]:
        return [(p, e, t) for (p, e), t in zip(self.remotes, self.tombstones, strict=True)]


def plan_batches(
    plan: Sequence[PullItem], options: SyncOptions
) -> tuple[list[tuple[PeerRef, list[PullItem]]], list[PullItem]]:
    """The items to pull in batches (small files over HTTP, grouped by their first source, cut
    at `batch_max_files` / `batch_max_bytes`), and the rest, pulled one by one. A peer with a
    single small file gets no batch."""
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


async def tracked_pull(
    progress: SyncProgress,
    item: PullItem,
    pull: Callable[[], Awaitable[TransferResult | None]],
) -> TransferResult | None:
    """Run `pull`, moving `progress` as its bytes arrive (never past the file's size) and
    counting the file done, with all its bytes, however the pull ends."""
    counted = 0

    def received(count: int) -> None:
        nonlocal counted
        step = min(count, item.entry.size - counted)
        if step > 0:
            counted += step
            progress.bytes_done += step

    token = RECEIVED.set(received)
    try:
        return await pull()
    finally:
        RECEIVED.reset(token)
        progress.files_done += 1
        progress.bytes_done += item.entry.size - counted


async def gather_listings(
    local: Awaitable[Listing], remotes: Sequence[Awaitable[RemoteManifest]]
) -> tuple[Listing, list[RemoteManifest | BaseException]]:
    """This node's listing and every peer's manifest, side by side; a peer's failure is
    returned in its place. Cancelling cancels the local listing too."""
    local_task = asyncio.ensure_future(local)
    try:
        results = await asyncio.gather(*remotes, return_exceptions=True)
    except BaseException:
        local_task.cancel()
        await asyncio.gather(local_task, return_exceptions=True)
        raise
    return await local_task, list(results)


@dataclass(frozen=True)
class TransferLog:
    """The WAL entries of transfers: `sync_started` before the bytes move, committed once the
    files are in place (a crash leaves it pending, so recovery resumes it), rolled back with
    the reason on failure. Without a WAL every step does nothing."""

    wal: WriteAheadLog | None

    async def begin(self, payload: dict[str, object], what: str) -> int | None:
        """Log the start of `what`; FileSyncError (naming it) when the WAL refuses."""
        if self.wal is None:
            return None
        try:
            return await self.wal.append(SYNC_STARTED, payload)
        except WalError as exc:
            raise FileSyncError(f"cannot log {what}: {exc}") from exc

    async def end(self, wal_id: int | None, failure: str | None = None) -> None:
        """Commit the entry, or roll it back with `failure`; raises WalError."""
        if self.wal is None or wal_id is None:
            return
        if failure is None:
            await self.wal.commit(wal_id)
        else:
            await self.wal.rollback(wal_id, reason=failure)


def file_payload(peer: PeerRef, category: str, entry: ManifestEntry) -> dict[str, object]:
    """The `sync_started` payload of one file (what recovery needs to resume it)."""
    return {
        "peer": peer.to_json(),
        "category": category,
        "path": entry.path,
        "hash": entry.hash,
        "size": entry.size,
        "mtime_ns": entry.mtime_ns,
    }


def batch_payload(
    peer: PeerRef, category: str, entries: Sequence[ManifestEntry]
) -> dict[str, object]:
    """The `sync_started` payload of a batch of small files from one peer."""
    return {
        "peer": peer.to_json(),
        "category": category,
        "batch": [
            {"path": e.path, "hash": e.hash, "size": e.size, "mtime_ns": e.mtime_ns}
            for e in entries
        ],
    }
