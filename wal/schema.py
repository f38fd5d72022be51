"""The WAL's SQLite file: opening and validating it, its schema, the reads, and move_aside.

Functions here run on the connection's own thread (see writer.py and log.py) and raise WalError.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from config import fsync_directory
from wal.entry import EntryState, WalConfig, WalEntry, WalStats
from wal.errors import WalCorruptError, WalError, translate

APPLICATION_ID = 0x5348574C  # "SHWL": marks a file as a shoal write-ahead log
SCHEMA_VERSION = 1
SQLITE_HEADER = b"SQLite format 3\x00"
SIDECAR_SUFFIXES = ("-wal", "-shm")
COUNTER_NAMES = (
    "last_id",
    "appended_total",
    "committed_total",
    "rolled_back_total",
    "failed_total",
    "retries_total",
    "removed_committed",
    "removed_rolled_back",
    "removed_failed",
)
_TABLES = frozenset({"entries", "counters", "node_state"})
_SCHEMA = (
    """CREATE TABLE entries (
        id INTEGER PRIMARY KEY,
        entry_type TEXT NOT NULL,
        key TEXT,
        payload TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        retries INTEGER NOT NULL DEFAULT 0,
        error TEXT
    )""",
    "CREATE UNIQUE INDEX entries_key ON entries (key) WHERE key IS NOT NULL",
    "CREATE INDEX entries_pending ON entries (id) WHERE state = 'pending'",
    "CREATE INDEX entries_finished ON entries (updated_at) WHERE state != 'pending'",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TABLE node_state (
        key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL
    ) WITHOUT ROWID""",
)
_SELECT_ENTRY = (
    "SELECT id, entry_type, key, payload, state, created_at, updated_at, retries, error"
    " FROM entries WHERE id = ?"
)
_SELECT_PENDING = (
    "SELECT id, entry_type, key, payload, state, created_at, updated_at, retries, error"
    " FROM entries WHERE state = 'pending' AND id > :after_id"
    " AND (:entry_type IS NULL OR entry_type = :entry_type)"
    " ORDER BY id LIMIT :limit"
)
"""Named placeholders bound from a dict: Python 3.12 deprecates binding numbered or named ones
from a sequence."""
_SELECT_OF_TYPES = (  # the types as one JSON array: no SQL built from text
    "SELECT id, entry_type, key, payload, state, created_at, updated_at, retries, error"
    " FROM entries WHERE entry_type IN (SELECT value FROM json_each(?))"
    " AND created_at >= ? AND id > ? ORDER BY id LIMIT ?"
)

_claimed: set[Path] = set()
_claimed_lock = threading.Lock()


def sidecar(path: Path, suffix: str) -> Path:
    """The SQLite companion file of `path` (`-wal` or `-shm`)."""
    return path.with_name(path.name + suffix)


def claim(path: Path) -> None:
    """Register `path` as open in this process; a second WriteAheadLog on it is refused."""
    with _claimed_lock:
        if path in _claimed:
            raise WalError(f"{path}: already open by another WriteAheadLog in this process")
        _claimed.add(path)


def release(path: Path) -> None:
    """Undo `claim`; harmless when not claimed."""
    with _claimed_lock:
        _claimed.discard(path)


def open_write_connection(path: Path, config: WalConfig) -> sqlite3.Connection:
    """Open (creating when absent) and validate the WAL at `path`; the caller owns the result."""
    _check_files(path)
    created = not path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            path, timeout=config.busy_timeout_s, isolation_level=None, check_same_thread=True
        )
    except (sqlite3.Error, OSError) as exc:
        raise translate(exc, path, "opening") from exc
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise WalError(f"{path}: SQLite refused WAL journal mode (got {mode!r})")
        _ensure_schema(conn, path)
        if config.quick_check_on_open:
            _quick_check(conn, path)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA wal_autocheckpoint = {int(config.wal_autocheckpoint_pages)}")
        conn.execute(f"PRAGMA journal_size_limit = {int(config.journal_size_limit_bytes)}")
        if created:
            fsync_directory(path.parent)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error | OSError):
            raise _open_error(exc, path) from exc
        raise
    return conn


def open_read_connection(path: Path, config: WalConfig) -> sqlite3.Connection:
    """A second connection for reads only; WAL mode lets it run beside the writer."""
    try:
        conn = sqlite3.connect(
            path, timeout=config.busy_timeout_s, isolation_level=None, check_same_thread=True
        )
        conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error as exc:
        raise translate(exc, path, "opening the read connection") from exc
    return conn


def _open_error(exc: sqlite3.Error | OSError, path: Path) -> WalError:
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
        return WalCorruptError(path, "not an SQLite database")
    return translate(exc, path, "opening")


def _check_files(path: Path) -> None:
    try:
        if path.exists():
            if path.stat().st_size > 0:
                with path.open("rb") as f:
                    header = f.read(len(SQLITE_HEADER))
                if header != SQLITE_HEADER:
                    raise WalCorruptError(path, "not an SQLite database")
            return
        wal_file = sidecar(path, "-wal")
        if wal_file.exists() and wal_file.stat().st_size > 0:
            raise WalCorruptError(
                path, f"the database is missing but its -wal file {wal_file.name} exists"
            )
    except OSError as exc:
        raise WalError(f"{path}: cannot read the file: {exc}") from exc


def _ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    if _read_marker(conn) == (0, 0) and not _table_names(conn):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if _read_marker(conn) == (0, 0) and not _table_names(conn):
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.executemany(
                    "INSERT INTO counters (name, value) VALUES (?, 0)",
                    [(name,) for name in COUNTER_NAMES],
                )
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    application_id, version = _read_marker(conn)
    if application_id != APPLICATION_ID:
        raise WalCorruptError(
            path, f"not a shoal WAL (SQLite application_id is {application_id:#x})"
        )
    if version != SCHEMA_VERSION:
        raise WalError(
            f"{path}: WAL schema version {version} is not the supported {SCHEMA_VERSION}; "
            "use the shoal release that wrote it"
        )
    missing = _TABLES - _table_names(conn)
    if missing:
        raise WalCorruptError(path, f"shoal WAL lacks its tables {sorted(missing)}")


def _read_marker(conn: sqlite3.Connection) -> tuple[int, int]:
    application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    return application_id, version


def _table_names(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {str(row[0]) for row in rows}


def _quick_check(conn: sqlite3.Connection, path: Path) -> None:
    rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    problems = [" ".join(str(row[0]).split()) for row in rows]
    if problems != ["ok"]:
        raise WalCorruptError(path, "integrity check failed: " + "; ".join(problems))


def move_aside(path: Path) -> Path:
    """Rename the database at `path` and its -wal/-shm to `<name>.corrupt-<UTC timestamp>`.

    Returns the new path of the database. The database is moved first, so an interruption
    never leaves a -wal file beside a database it does not belong to. Refuses a file that a
    WriteAheadLog of this process has open. Raises WalError when there is nothing to move.
    """
    path = Path(path).absolute()
    with _claimed_lock:
        if path.resolve() in _claimed:
            raise WalError(f"{path}: open in this process; close it before moving it aside")
    sources = [path, *(sidecar(path, suffix) for suffix in SIDECAR_SUFFIXES)]
    if not any(source.exists() for source in sources):
        raise WalError(f"{path}: nothing to move aside")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    attempt = 1
    while any(sidecar(target, s).exists() for s in ("", *SIDECAR_SUFFIXES)):
        attempt += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{attempt}")
    try:
        for suffix in ("", *SIDECAR_SUFFIXES):
            source = sidecar(path, suffix)
            if source.exists():
                os.replace(source, sidecar(target, suffix))
        fsync_directory(path.parent)
    except OSError as exc:
        raise WalError(f"{path}: moving aside to {target} failed: {exc}") from exc
    return target


def row_to_entry(row: tuple[Any, ...]) -> WalEntry:
    """Build a WalEntry from a row of the entries table, columns in table order."""
    entry_id, entry_type, key, payload, state, created_at, updated_at, retries, error = row
    return WalEntry(
        id=int(entry_id),
        entry_type=str(entry_type),
        key=None if key is None else str(key),
        payload=json.loads(str(payload)),
        state=EntryState(str(state)),
        created_at=float(created_at),
        updated_at=float(updated_at),
        retries=int(retries),
        error=None if error is None else str(error),
    )


def read_entry(conn: sqlite3.Connection, entry_id: int) -> WalEntry | None:
    """The entry with `entry_id`, or None."""
    row = conn.execute(_SELECT_ENTRY, (entry_id,)).fetchone()
    return None if row is None else row_to_entry(row)


def read_pending(
    conn: sqlite3.Connection, entry_type: str | None, after_id: int, limit: int | None
) -> list[WalEntry]:
    """Pending entries with id > after_id, oldest first, optionally of one type."""
    params = {
        "after_id": after_id,
        "entry_type": entry_type,
        "limit": -1 if limit is None else limit,
    }
    return [row_to_entry(row) for row in conn.execute(_SELECT_PENDING, params)]


def read_entries_of(
    conn: sqlite3.Connection, entry_types: tuple[str, ...], since: float, after_id: int, limit: int
) -> list[WalEntry]:
    """Entries of `entry_types` in any state created at or after `since` with id > after_id,
    oldest first, at most `limit`."""
    if not entry_types:
        return []
    rows = conn.execute(_SELECT_OF_TYPES, (json.dumps(entry_types), since, after_id, limit))
    return [row_to_entry(row) for row in rows]


def read_counters(conn: sqlite3.Connection) -> dict[str, int]:
    """The durable counters (see COUNTER_NAMES)."""
    return {str(name): int(value) for name, value in conn.execute("SELECT * FROM counters")}


def read_oldest_pending_created_at(conn: sqlite3.Connection) -> float | None:
    """Creation time of the oldest pending entry, or None when nothing is pending."""
    row = conn.execute(
        "SELECT created_at FROM entries WHERE state = 'pending' ORDER BY id LIMIT 1"
    ).fetchone()
    return None if row is None else float(row[0])


def read_state(conn: sqlite3.Connection, key: str) -> str | None:
    """The JSON text stored under `key` in the node's durable state, or None."""
    row = conn.execute("SELECT value FROM node_state WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def read_stats(conn: sqlite3.Connection, path: Path, queue_depth: int) -> WalStats:
    """Counts, totals and file sizes, from one read transaction of counters and oldest entry."""
    conn.execute("BEGIN")
    try:
        totals = read_counters(conn)
        oldest = read_oldest_pending_created_at(conn)
    finally:
        conn.execute("COMMIT")
    finished = totals["committed_total"] + totals["rolled_back_total"] + totals["failed_total"]
    removed = {s: totals[f"removed_{s}"] for s in ("committed", "rolled_back", "failed")}
    return WalStats(
        pending=totals["appended_total"] - finished,
        committed=totals["committed_total"] - removed["committed"],
        rolled_back=totals["rolled_back_total"] - removed["rolled_back"],
        failed=totals["failed_total"] - removed["failed"],
        oldest_pending_age_s=None if oldest is None else max(0.0, time.time() - oldest),
        appended_total=totals["appended_total"],
        committed_total=totals["committed_total"],
        rolled_back_total=totals["rolled_back_total"],
        failed_total=totals["failed_total"],
        retries_total=totals["retries_total"],
        removed_total=sum(removed.values()),
        last_id=totals["last_id"],
        queue_depth=queue_depth,
        db_size_bytes=_file_size(path),
        wal_file_bytes=_file_size(sidecar(path, "-wal")),
    )


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
