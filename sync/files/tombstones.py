"""Tombstones of deleted files (path, hash, deleting node, time) for categories whose deletions
propagate: the decisions (which copy a tombstone deletes, which it loses to) and their durable
store (SQLite, WAL mode, synchronous=FULL), kept `ttl_s` after the deletion.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from config.closing import AsyncClosing
from sync.errors import FileSyncError, ManifestError, PathRefusedError
from sync.files.manifest import ManifestEntry
from sync.files.threaded_db import close_on_thread, run_on_thread
from sync.guards import validate_rel_path

logger = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], int]
"""Wall-clock time in nanoseconds (time.time_ns unless a test moves time)."""
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS tombstones (
        category TEXT NOT NULL, path TEXT NOT NULL, hash TEXT NOT NULL, node TEXT NOT NULL,
        deleted_at_ns INTEGER NOT NULL, PRIMARY KEY (category, path, hash)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS last_sync (
        category TEXT PRIMARY KEY, at_ns INTEGER NOT NULL
    ) WITHOUT ROWID""",
)
TombstoneKey = tuple[str, str]
"""(path, hash): one tombstone per deleted version of a path."""


@dataclass(frozen=True, slots=True)
class Tombstone:
    """Version `hash` of `path` was deleted on `node_id` at `deleted_at_ns` (wall clock)."""

    path: str
    hash: str
    node_id: str
    deleted_at_ns: int

    @property
    def key(self) -> TombstoneKey:
        return (self.path, self.hash)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "hash": self.hash,
            "node": self.node_id,
            "deleted_at_ns": self.deleted_at_ns,
        }

    def kills(self, entry: ManifestEntry) -> bool:
        """True when `entry` is the deleted version: same path and content, written no later
        than the deletion. Another content, or a copy re-created after it, wins."""
        return (
            entry.path == self.path
            and entry.hash == self.hash
            and entry.mtime_ns <= self.deleted_at_ns
        )

    def expired(self, now_ns: int, ttl_s: float) -> bool:
        return now_ns - self.deleted_at_ns > ttl_s * 1e9


def parse_tombstone(data: Any) -> Tombstone:
    """A Tombstone from its JSON form; ManifestError when malformed."""
    if not isinstance(data, Mapping):
        raise ManifestError(f"tombstone must be an object, got {type(data).__name__}")
    path = data.get("path")
    try:
        validate_rel_path(path)  # type: ignore[arg-type]
    except PathRefusedError as exc:
        raise ManifestError(f"tombstone path refused: {exc}") from exc
    assert isinstance(path, str)
    digest, node, at = data.get("hash"), data.get("node"), data.get("deleted_at_ns")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise ManifestError(f"tombstone of {path}: hash must be 64 lowercase hex digits")
    if not isinstance(node, str):
        raise ManifestError(f"tombstone of {path}: node must be a string")
    if isinstance(at, bool) or not isinstance(at, int):
        raise ManifestError(f"tombstone of {path}: deleted_at_ns must be an integer")
    return Tombstone(path, digest, node, at)


def parse_tombstones(page: Any) -> tuple[Tombstone, ...]:
    """The `tombstones` of a manifest page (absent: none); ManifestError when malformed."""
    raw = page.get("tombstones", []) if isinstance(page, Mapping) else []
    if not isinstance(raw, list):
        raise ManifestError("manifest page's tombstones must be a list")
    return tuple(parse_tombstone(item) for item in raw)


def tombstone_etag(listing_etag: str, tombstones: Sequence[Tombstone]) -> str:
    """The etag of a manifest served with `tombstones`: the listing's when there are none."""
    if not tombstones:
        return listing_etag
    text = listing_etag + "".join(
        f"\n{t.path}\0{t.hash}\0{t.node_id}\0{t.deleted_at_ns}" for t in tombstones
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def deletion_time_ns(entry: ManifestEntry, now_ns: int) -> int:
    """When a removal of `entry` found at `now_ns` is recorded: now, or just after the version's
    own mtime when that lies ahead of this clock (a deletion follows what it deletes)."""
    return max(now_ns, entry.mtime_ns + 1)


@dataclass(frozen=True)
class DeletionPlan:
    """What a sync round does with tombstones: local copies to delete (each with the tombstone
    that kills it), peers' tombstones to store here, and this node's tombstones a newer local
    file beat (cleared). `known` are the live tombstones that still apply, to filter pulls."""

    delete: tuple[tuple[ManifestEntry, Tombstone], ...] = ()
    adopt: tuple[Tombstone, ...] = ()
    clear: tuple[TombstoneKey, ...] = ()
    known: Mapping[TombstoneKey, Tombstone] | None = None

    def surviving(self, entries: Iterable[ManifestEntry]) -> tuple[ManifestEntry, ...]:
        """`entries` without the versions a known tombstone deleted."""
        known = self.known or {}
        if not known:
            return tuple(entries)
        return tuple(
            entry
            for entry in entries
            if (tomb := known.get((entry.path, entry.hash))) is None or not tomb.kills(entry)
        )


def plan_deletions(
    local: Mapping[str, ManifestEntry],
    mine: Mapping[TombstoneKey, Tombstone],
    theirs: Iterable[Tombstone],
    *,
    now_ns: int,
    ttl_s: float,
) -> DeletionPlan:
    """Decide a round (pure): every live tombstone, this node's and its peers', is weighed
    against the local file at its path. A file written after the tombstone wins (and clears it
    here); a file of the tombstone's content, no newer than it, is deleted; a file of another
    content stays (it is another version). Expired tombstones are ignored."""
    merged: dict[TombstoneKey, Tombstone] = {}
    for tomb in (*mine.values(), *theirs):
        if tomb.expired(now_ns, ttl_s):
            continue
        seen = merged.get(tomb.key)
        if seen is None or tomb.deleted_at_ns > seen.deleted_at_ns:
            merged[tomb.key] = tomb
    delete: list[tuple[ManifestEntry, Tombstone]] = []
    adopt: list[Tombstone] = []
    clear: list[TombstoneKey] = []
    known: dict[TombstoneKey, Tombstone] = {}
    for key, tomb in sorted(merged.items()):
        copy = local.get(tomb.path)
        if copy is not None and copy.mtime_ns > tomb.deleted_at_ns:
            if key in mine:
                clear.append(key)
            continue
        known[key] = tomb
        if copy is not None and tomb.kills(copy):
            delete.append((copy, tomb))
        held = mine.get(key)
        if held is None or held.deleted_at_ns < tomb.deleted_at_ns:
            adopt.append(tomb)
    return DeletionPlan(tuple(delete), tuple(adopt), tuple(clear), known)


class TombstoneStore(AsyncClosing):
    """The tombstones of every category of one node and when each category last synced, in
    one SQLite file (async context manager; close() is idempotent). Every change is committed
    with synchronous=FULL before the call returns. Tombstones are read from memory."""

    def __init__(self, db_path: Path, ttl_s: float, *, clock: Clock = time.time_ns) -> None:
        if not ttl_s > 0:
            raise ValueError(f"tombstone_ttl_s must be > 0, got {ttl_s!r}")
        self.db_path = Path(db_path)
        self.ttl_s = ttl_s
        self.clock = clock
        self._tombs: dict[str, dict[TombstoneKey, Tombstone]] = {}
        self._last_sync: dict[str, int] = {}
        self._db: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def _enter(self) -> None:
        await self.open()

    async def open(self) -> None:
        """Create or open the database and load it."""
        if self._executor is not None or self._closed:
            raise FileSyncError(f"tombstone store {self.db_path} was already opened")
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tombstones")
        try:
            tombs, synced = await self._run(self._connect)
        except BaseException:
            await self.close()
            raise
        for category, path, digest, node, at in tombs:
            tomb = Tombstone(path, digest, node, at)
            self._tombs.setdefault(category, {})[tomb.key] = tomb
        self._last_sync = dict(synced)

    def _connect(self) -> tuple[list[tuple[str, str, str, str, int]], list[tuple[str, int]]]:
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        self._db = db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        for statement in _SCHEMA:
            db.execute(statement)
        tombs = list(db.execute("SELECT category, path, hash, node, deleted_at_ns FROM tombstones"))
        return tombs, list(db.execute("SELECT category, at_ns FROM last_sync"))

    async def close(self) -> None:
        """Close the database; idempotent and irreversible."""
        if self._closed:
            return
        self._closed = True
        executor, self._executor = self._executor, None
        db, self._db = self._db, None
        await close_on_thread(executor, db)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await run_on_thread(self._executor, f"tombstone store {self.db_path}", fn, *args)

    def _write(
        self, category: str, upserts: Sequence[Tombstone], removed: Sequence[TombstoneKey]
    ) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "DELETE FROM tombstones WHERE category = ? AND path = ? AND hash = ?",
                [(category, path, digest) for path, digest in removed],
            )
            db.executemany(
                "INSERT OR REPLACE INTO tombstones VALUES (?, ?, ?, ?, ?)",
                [(category, t.path, t.hash, t.node_id, t.deleted_at_ns) for t in upserts],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def now_ns(self) -> int:
        return self.clock()

    def held(self, category: str) -> dict[TombstoneKey, Tombstone]:
        """Every tombstone of `category` stored here, live or not yet purged."""
        return dict(self._tombs.get(category, {}))

    def live(self, category: str) -> tuple[Tombstone, ...]:
        """The tombstones of `category` younger than the TTL, sorted by (path, hash)."""
        now_ns = self.clock()
        held = self._tombs.get(category, {})
        return tuple(held[key] for key in sorted(held) if not held[key].expired(now_ns, self.ttl_s))

    async def change(
        self,
        category: str,
        upserts: Sequence[Tombstone] = (),
        removed: Sequence[TombstoneKey] = (),
    ) -> None:
        """Store `upserts` and drop `removed` in one durable transaction."""
        if not upserts and not removed:
            return
        async with self._lock:
            await self._run(self._write, category, list(upserts), list(removed))
            held = self._tombs.setdefault(category, {})
            for key in removed:
                held.pop(key, None)
            for tomb in upserts:
                held[tomb.key] = tomb

    async def record_removed(
        self, category: str, entries: Sequence[ManifestEntry], node_id: str
    ) -> list[Tombstone]:
        """Tombstones for files found gone from this node's directory, stored durably before
        the caller forgets the files. A version already tombstoned keeps its tombstone, unless
        it was re-written after it (then this removal is a new deletion)."""
        now_ns = self.clock()
        held = self._tombs.get(category, {})
        fresh: list[Tombstone] = []
        for entry in entries:
            known = held.get((entry.path, entry.hash))
            if known is not None and known.kills(entry):
                continue
            fresh.append(
                Tombstone(entry.path, entry.hash, node_id, deletion_time_ns(entry, now_ns))
            )
        await self.change(category, fresh)
        return fresh

    async def purge_expired(self, category: str) -> int:
        """Drop the tombstones of `category` older than the TTL; how many."""
        now_ns = self.clock()
        old = [k for k, t in self._tombs.get(category, {}).items() if t.expired(now_ns, self.ttl_s)]
        await self.change(category, (), old)
        return len(old)

    def last_sync_ns(self, category: str) -> int | None:
        """When `category` last read its peers' tombstones; None: never."""
        return self._last_sync.get(category)

    async def set_last_sync(self, category: str, at_ns: int) -> None:
        def write() -> None:
            db = self._db
            assert db is not None
            db.execute("INSERT OR REPLACE INTO last_sync VALUES (?, ?)", (category, at_ns))

        async with self._lock:
            await self._run(write)
            self._last_sync[category] = at_ns
