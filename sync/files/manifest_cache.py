"""Incremental manifests: a SQLite cache keyed by (path, size, mtime_ns, inode) so an unchanged
tree is re-listed with one stat per file and no hashing; changed files are hashed in threads.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import enum
import hashlib
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sync.files.dirstamps import DirStamps, StampRecorder, unchanged_since
from sync.files.errors import FileSyncError
from sync.files.manifest import ManifestEntry, check_piece_size, digest_of_fd
from sync.files.threaded_db import close_on_thread, run_on_thread
from sync.guards import INTERNAL_PREFIX

logger = logging.getLogger(__name__)

T = TypeVar("T")
Hasher = Callable[[int, int], tuple[int, str, tuple[str, ...]]]
"""hasher(fd, piece_size) -> (size, hash, piece hashes); digest_of_fd unless a test counts."""
StatKey = tuple[int, int, int]
RemovedHook = Callable[[list[ManifestEntry]], Awaitable[None]]
"""on_removed(entries): files a scan found gone, awaited before the cache forgets them."""
HASH_BATCH_FILES = 64
HASH_BATCH_BYTES = 256 << 20
HASH_THREADS = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL, hash TEXT NOT NULL, pieces BLOB NOT NULL, piece_size INTEGER NOT NULL
) WITHOUT ROWID
"""


@dataclass(frozen=True, slots=True)
class CachedFile:
    """A hashed file and the stat key it was hashed at; `text` is the entry's JSON."""

    key: StatKey
    entry: ManifestEntry
    text: str


@dataclass(frozen=True)
class Listing:
    """Every file of a category at one moment, sorted by path; `etag` names this content."""

    entries: tuple[ManifestEntry, ...]
    texts: tuple[str, ...]
    paths: tuple[str, ...]
    etag: str
    taken_at: float
    scan_s: float = 0.0

    def page(self, after: str | None, limit: int) -> tuple[int, int, str | None]:
        """(start, end, next cursor) of the page after path `after` of at most `limit`."""
        start = 0 if after is None else bisect.bisect_right(self.paths, after)
        end = min(len(self.paths), start + max(1, limit))
        return start, end, self.paths[end - 1] if end < len(self.paths) else None


def stat_key(info: os.stat_result) -> StatKey:
    return (info.st_size, info.st_mtime_ns, info.st_ino)


def _plain_name(name: str, directory: str) -> bool:
    """False for our .shoal- files and names that are not valid UTF-8 (not listable)."""
    if name.startswith(INTERNAL_PREFIX):
        return False
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            logger.debug("skipping %r in %s: name is not UTF-8", name, directory)
            return False
    return True


def _compare(
    root: Path, files: Mapping[str, CachedFile], stamps: StampRecorder
) -> tuple[list[CachedFile], list[str], list[str]]:
    """(unchanged cached files, changed or new paths, removed paths) of a scan, each directory's
    stamp recorded in `stamps`. Blocking.

    The walk of _walk, inlined: this loop runs once per file on every listing."""
    unchanged: list[CachedFile] = []
    changed: list[str] = []
    known = 0
    get = files.get
    stack = [(os.fspath(root), "")]
    while stack:
        directory, prefix = stack.pop()
        stamps.record(directory)
        try:
            with os.scandir(directory) as it:
                for item in it:
                    name = item.name
                    if name.startswith(INTERNAL_PREFIX) or (
                        not name.isascii() and not _plain_name(name, directory)
                    ):
                        continue
                    if item.is_file(follow_symlinks=False):
                        try:
                            info = item.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        path = prefix + name
                        cached = get(path)
                        if cached is None:
                            changed.append(path)
                            continue
                        known += 1
                        if cached.key == (info.st_size, info.st_mtime_ns, info.st_ino):
                            unchanged.append(cached)
                        else:
                            changed.append(path)
                    elif item.is_dir(follow_symlinks=False):
                        stack.append((item.path, f"{prefix}{name}/"))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as exc:
            logger.warning("cannot list %s: %s", directory, exc)
    if known == len(files):
        return unchanged, changed, []
    seen = {item.entry.path for item in unchanged}
    seen.update(changed)
    return unchanged, changed, [path for path in files if path not in seen]


def _build_listing(cached: list[CachedFile], started: float) -> Listing:
    cached.sort(key=lambda item: item.entry.path)
    texts = tuple(item.text for item in cached)
    etag = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:32]
    return Listing(
        tuple(item.entry for item in cached),
        texts,
        tuple(item.entry.path for item in cached),
        etag,
        time.monotonic(),
        time.monotonic() - started,
    )


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class ManifestCache:
    """The manifest of one category directory, backed by a SQLite cache file (async context
    manager; close() is idempotent). Hashing and SQLite run off the event loop. `on_removed`
    hears of files a scan finds gone before they leave the cache (a failure keeps them, so
    the next scan reports them again)."""

    def __init__(
        self,
        root: Path,
        db_path: Path,
        piece_size: int,
        *,
        hasher: Hasher = digest_of_fd,
        on_removed: RemovedHook | None = None,
    ) -> None:
        self.root = Path(root)
        self.db_path = Path(db_path)
        self.piece_size = check_piece_size(piece_size)
        self._hasher = hasher
        self._on_removed = on_removed
        self._files: dict[str, CachedFile] = {}
        self._listing: Listing | None = None
        self._stamps: DirStamps | None = None  # of the scan that made _listing
        self._generation = 0  # bumped by every change of _files outside a scan
        self._listed_generation = -1
        self._lock = asyncio.Lock()
        self._db: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._state = _State.UNOPENED

    async def __aenter__(self) -> ManifestCache:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Create the root and the cache file if absent, and load the cache."""
        if self._state is not _State.UNOPENED:
            raise FileSyncError(f"manifest cache {self.db_path} was already opened")
        self._state = _State.OPEN
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="manifest-db")
        try:
            rows = await self._run_db(self._open_db)
        except BaseException:
            await self.close()
            raise
        for path, size, mtime_ns, ino, digest, blob in rows:
            pieces = tuple(blob[i : i + 32].hex() for i in range(0, len(blob), 32))
            entry = ManifestEntry(path, size, mtime_ns, digest, pieces, self.piece_size)
            self._files[path] = CachedFile((size, mtime_ns, ino), entry, entry.json_text())

    async def close(self) -> None:
        """Close the cache file. Idempotent; the cache cannot be reopened."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        executor, self._executor = self._executor, None
        db, self._db = self._db, None
        await close_on_thread(executor, db)

    def _open_db(self) -> list[tuple[str, int, int, int, str, bytes]]:
        self.root.mkdir(parents=True, exist_ok=True)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            logger.warning(
                "manifest cache %s is unreadable (%s); starting afresh", self.db_path, exc
            )
            if self._db is not None:
                self._db.close()
                self._db = None
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.db_path}{suffix}").unlink(missing_ok=True)
            return self._connect()

    def _connect(self) -> list[tuple[str, int, int, int, str, bytes]]:
        db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        self._db = db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(_SCHEMA)
        query = "SELECT path, size, mtime_ns, ino, hash, pieces FROM files WHERE piece_size = ?"
        return list(db.execute(query, (self.piece_size,)))

    async def _run_db(self, fn: Callable[..., T], *args: object) -> T:
        executor = self._executor if self._state is _State.OPEN else None
        return await run_on_thread(executor, f"manifest cache {self.db_path}", fn, *args)

    def _write(self, upserts: list[CachedFile], removed: list[str]) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN")
        try:
            db.executemany("DELETE FROM files WHERE path = ?", [(path,) for path in removed])
            db.executemany(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        item.entry.path,
                        item.key[0],
                        item.key[1],
                        item.key[2],
                        item.entry.hash,
                        b"".join(bytes.fromhex(p) for p in item.entry.pieces),
                        self.piece_size,
                    )
                    for item in upserts
                ],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def lookup(self, path: str) -> ManifestEntry | None:
        """The cached entry of `path` as of the last scan or record (no disk access)."""
        cached = self._files.get(path)
        return cached.entry if cached is not None else None

    def lookup_keyed(self, path: str) -> tuple[ManifestEntry, StatKey] | None:
        """The cached entry of `path` and the stat key it was hashed at (no disk access)."""
        cached = self._files.get(path)
        return (cached.entry, cached.key) if cached is not None else None

    @property
    def last_listing(self) -> Listing | None:
        return self._listing

    async def listing(self, max_age_s: float = 0.0) -> Listing:
        """A listing of the whole tree: the last one if younger than `max_age_s` and no file was
        created, deleted or renamed since (directory stamps), else a new scan (callers arriving
        during a scan share its result)."""
        requested_at = time.monotonic()
        async with self._lock:
            current = self._listing
            if (
                current is not None
                and (
                    current.taken_at >= requested_at or requested_at - current.taken_at < max_age_s
                )
                and await unchanged_since(self._stamps)
            ):
                return current
            started = time.monotonic()
            recorder = StampRecorder(time.time_ns())
            unchanged, changed, removed = await asyncio.to_thread(
                _compare, self.root, self._files, recorder
            )
            self._stamps = recorder.done()
            fresh = await self._hash_paths(changed)
            if removed and self._on_removed is not None:
                await self._on_removed([self._files[path].entry for path in removed])
            for path in removed:
                del self._files[path]
            for path in changed:
                self._files.pop(path, None)
            for item in fresh:
                self._files[item.entry.path] = item
            if (
                current is not None
                and not changed
                and not removed
                and self._listed_generation == self._generation
            ):
                listing = dataclasses.replace(  # same files, same stat keys: same listing
                    current, taken_at=time.monotonic(), scan_s=time.monotonic() - started
                )
                self._listing = listing
                return listing
            unchanged.extend(fresh)
            listing = await asyncio.to_thread(_build_listing, unchanged, started)
            self._generation += 1
            self._listed_generation = self._generation
            if fresh or removed:
                await self._run_db(self._write, fresh, removed)
            self._listing = listing
            return listing

    async def _hash_paths(self, paths: list[str]) -> list[CachedFile]:
        batches: list[list[str]] = [[]]
        batch_bytes = 0
        for path in paths:
            if len(batches[-1]) >= HASH_BATCH_FILES or batch_bytes >= HASH_BATCH_BYTES:
                batches.append([])
                batch_bytes = 0
            batches[-1].append(path)
            try:
                batch_bytes += os.stat(self.root / path, follow_symlinks=False).st_size
            except OSError:
                continue
        limit = asyncio.Semaphore(HASH_THREADS)

        async def run(batch: list[str]) -> list[CachedFile]:
            async with limit:
                return await asyncio.to_thread(self._hash_batch, batch)

        results = await asyncio.gather(*(run(batch) for batch in batches if batch))
        return [item for result in results for item in result]

    def _hash_batch(self, paths: list[str]) -> list[CachedFile]:
        out: list[CachedFile] = []
        for path in paths:
            try:
                fd = os.open(self.root / path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                logger.debug("not hashing %s: %s", path, exc)
                continue
            try:
                item = self._hash_open(path, fd)
            except OSError as exc:
                logger.warning("cannot hash %s/%s: %s", self.root, path, exc)
                item = None
            finally:
                os.close(fd)
            if item is not None:
                out.append(item)
        return out

    def _hash_open(self, path: str, fd: int) -> CachedFile | None:
        """Hash an open file; None when it is not regular or changed while being hashed."""
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return None
        size, digest, pieces = self._hasher(fd, self.piece_size)
        after = os.fstat(fd)
        if stat_key(after) != stat_key(before) or size != after.st_size:
            logger.debug("%s changed while being hashed; listed at the next scan", path)
            return None
        entry = ManifestEntry(path, size, after.st_mtime_ns, digest, pieces, self.piece_size)
        return CachedFile(stat_key(after), entry, entry.json_text())

    async def entry_for_open_file(self, path: str, fd: int) -> ManifestEntry | None:
        """The entry of an open file (hashing it when the cache is stale); None when the file
        changes while it is hashed."""
        info = await asyncio.to_thread(os.fstat, fd)
        cached = self._files.get(path)
        if cached is not None and cached.key == stat_key(info):
            return cached.entry
        async with self._lock:
            item = await asyncio.to_thread(self._hash_open, path, fd)
            if item is not None:
                self._files[path] = item
                self._generation += 1
                await self._run_db(self._write, [item], [])
        return item.entry if item is not None else None

    async def record_many(self, installed: list[tuple[ManifestEntry, os.stat_result]]) -> None:
        """`record` of many files with one database write."""
        items = [
            CachedFile(stat_key(info), entry, entry.json_text())
            for entry, info in (
                (dataclasses.replace(e, size=i.st_size, mtime_ns=i.st_mtime_ns), i)
                for e, i in installed
                if e.piece_size == self.piece_size
            )
        ]
        if not items:
            return
        async with self._lock:
            for item in items:
                self._files[item.entry.path] = item
            self._generation += 1
            await self._run_db(self._write, items, [])

    async def record(self, entry: ManifestEntry, info: os.stat_result) -> None:
        """Remember a file this node just installed and verified, so it is not hashed again."""
        if entry.piece_size != self.piece_size:
            return
        entry = dataclasses.replace(entry, size=info.st_size, mtime_ns=info.st_mtime_ns)
        item = CachedFile(stat_key(info), entry, entry.json_text())
        async with self._lock:
            self._files[entry.path] = item
            self._generation += 1
            await self._run_db(self._write, [item], [])
