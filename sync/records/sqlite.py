"""SQLite work of a record store, as plain functions over a connection: open, commit, read, copy.

Each runs on the thread that owns its connection; sqlite3 and OS errors become SyncErrors here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from config import fsync_directory
from sync.errors import SnapshotError, StoreWriteError
from sync.records.schema import RecordSchema, create_table_sql, select_sql, sql_type
from sync.records.types import (
    Cursor,
    IngestResult,
    RecordKey,
    RecordPage,
    SinceQuery,
    SnapshotInfo,
    StoreOptions,
    since_sql,
)
from sync.records.validate import row_to_record

logger = logging.getLogger(__name__)

Row = tuple[Any, ...]


def connect(path: Path, options: StoreOptions, *, writer: bool) -> sqlite3.Connection:
    """A connection in WAL mode with synchronous=FULL; the writer also creates the table."""
    conn = sqlite3.connect(
        path, timeout=options.busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(options.busy_timeout_s * 1000)}")
        if writer:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreWriteError(f"{path}: cannot switch to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA wal_autocheckpoint = {int(options.checkpoint_pages)}")
        conn.execute(f"PRAGMA journal_size_limit = {int(options.journal_size_limit_bytes)}")
        if not writer:
            conn.execute("PRAGMA query_only = 1")
    except BaseException:
        conn.close()
        raise
    return conn


def prepare_table(conn: sqlite3.Connection, schema: RecordSchema, path: Path) -> tuple[int, Any]:
    """Create the table and index if absent, check its columns, migrate columns whose type
    changed (see migrate_column_types); return (count, newest time)."""
    for statement in create_table_sql(schema):
        conn.execute(statement)
    problem = column_problem(conn, schema)
    if problem:
        raise StoreWriteError(f"{path}: {problem}")
    migrate_column_types(conn, schema, path)
    return read_totals(conn, schema)


def changed_columns(conn: sqlite3.Connection, schema: RecordSchema) -> dict[str, tuple[str, str]]:
    """The columns whose declared type differs from the schema's: name -> (stored, wanted)."""
    declared = {row[1]: str(row[2]).upper() for row in conn.execute(_table_info(schema.name))}
    wanted = {spec.name: sql_type(spec.kind) for spec in schema.fields}
    return {
        name: (declared[name], kind)
        for name, kind in wanted.items()
        if name in declared and declared[name] != kind
    }


def migrate_column_types(conn: sqlite3.Connection, schema: RecordSchema, path: Path) -> None:
    """Rebuild the table when a column's declared type changed between releases (e.g.
    rollouts' `model_version`, TEXT before it became INTEGER), in one transaction: only when
    every stored value converts without loss (`'3'` -> 3; not `'v3'`); otherwise raise a
    StoreWriteError that names the file, column and a value that does not convert, and change
    nothing."""
    changed = changed_columns(conn, schema)
    if not changed:
        return
    table = f'"{schema.name}"'
    conn.execute("BEGIN IMMEDIATE")
    try:
        for name, (stored, wanted) in changed.items():
            column = f'"{name}"'
            # Lossless: the value cast to the new type and back is the value itself.
            bad = conn.execute(
                f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL AND "  # noqa: S608
                f"CAST(CAST({column} AS {wanted}) AS {stored}) IS NOT {column} LIMIT 1"
            ).fetchone()
            if bad is not None:
                raise StoreWriteError(
                    f"{path}: column {name!r} of table {schema.name!r} is {stored} and this "
                    f"release stores it as {wanted}, but the value {bad[0]!r} does not convert; "
                    "fix or delete such rows with sqlite3, or move the file away, then restart"
                )
        old = f'"{schema.name}_before_migration"'
        names = ", ".join(f'"{n}"' for n in schema.columns)
        values = ", ".join(
            f'CAST("{n}" AS {changed[n][1]})' if n in changed else f'"{n}"' for n in schema.columns
        )
        conn.execute(f'DROP INDEX IF EXISTS "{schema.name}_by_time"')
        conn.execute(f"ALTER TABLE {table} RENAME TO {old}")
        for statement in create_table_sql(schema):
            conn.execute(statement)
        conn.execute(f"INSERT INTO {table} ({names}) SELECT {values} FROM {old}")  # noqa: S608
        conn.execute(f"DROP TABLE {old}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    logger.warning(
        "%s: migrated column types of table %r: %s",
        path,
        schema.name,
        ", ".join(f"{n} {a} -> {b}" for n, (a, b) in sorted(changed.items())),
    )


def _table_info(table: str) -> str:
    return f'PRAGMA table_info("{table}")'


def column_problem(conn: sqlite3.Connection, schema: RecordSchema) -> str | None:
    """Why the store's table cannot hold this schema's rows, or None when it can."""
    rows = conn.execute(f'PRAGMA table_info("{schema.name}")').fetchall()
    if not rows:
        return f"has no table {schema.name!r}"
    missing = set(schema.columns) - {row[1] for row in rows}
    if missing:
        return f"table {schema.name!r} lacks columns {sorted(missing)} (made by another schema)"
    return None


def read_totals(conn: sqlite3.Connection, schema: RecordSchema) -> tuple[int, Any]:
    """(row count, newest time) of the store's table."""
    table = f'"{schema.name}"'
    count = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: S608
    return int(count), newest_time(conn, schema) if count else None


def newest_time(conn: sqlite3.Connection, schema: RecordSchema) -> Any:
    table, time = f'"{schema.name}"', f'"{schema.time_column}"'
    return conn.execute(f"SELECT MAX({time}) FROM {table}").fetchone()[0]  # noqa: S608


def commit_jobs(
    conn: sqlite3.Connection, insert: str, jobs: Sequence[Sequence[Row]]
) -> list[IngestResult]:
    """Apply every job's rows with INSERT OR IGNORE in one transaction, in order, and commit.

    A job's duplicates are its rows whose key was present before that row was applied.
    """
    results = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for rows in jobs:
            inserted = conn.executemany(insert, rows).rowcount
            results.append(IngestResult(inserted, len(rows) - inserted))
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    return results


def checkpoint(conn: sqlite3.Connection, mode: str, where: str) -> None:
    """Run a WAL checkpoint (PASSIVE or TRUNCATE); a failure is logged, never raised."""
    try:
        busy, log_pages, done = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    except sqlite3.Error as exc:
        logger.warning("%s: %s checkpoint failed: %s", where, mode, exc)
        return
    if busy:
        logger.debug("%s: %s checkpoint incomplete (%s of %s pages)", where, mode, done, log_pages)


def read_page(
    conn: sqlite3.Connection, schema: RecordSchema, query: SinceQuery, *, fragments: bool = False
) -> RecordPage:
    """One page of records in (time, key) order; `next` is set when the page is full.

    With `fragments`, json fields stay their stored text (see row_to_record).
    """
    sql, params = since_sql(schema, query)
    rows = conn.execute(sql, params).fetchall()
    records = [row_to_record(schema, row, fragments=fragments) for row in rows]
    cursor: Cursor | None = None
    if len(rows) == query.limit and rows:
        last = records[-1]
        cursor = (float(last[schema.time_column]), last[schema.key])
    return RecordPage(records, cursor)


def read_page_json(conn: sqlite3.Connection, schema: RecordSchema, query: SinceQuery) -> bytes:
    """The JSON body of a `/since` page, json fields embedded as stored (never re-encoded)."""
    return orjson.dumps(read_page(conn, schema, query, fragments=True).to_json())


def count_range(
    conn: sqlite3.Connection,
    schema: RecordSchema,
    equals: Sequence[tuple[str, Any]],
    after: tuple[float, RecordKey] | None,
    through: tuple[float, RecordKey] | None,
) -> int:
    """How many records with every `equals` (field, value) lie in (after, through] of the
    (time, key) order; None leaves that end open."""
    time, key = f'"{schema.time_column}"', f'"{schema.key}"'
    where, params = ["1"], []
    if after is not None:
        where.append(f"({time}, {key}) > (?, ?)")
        params += list(after)
    if through is not None:
        where.append(f"({time}, {key}) <= (?, ?)")
        params += list(through)
    for name, value in equals:
        if name not in schema.columns:
            raise ValueError(f"{schema.name} has no field {name!r}")
        where.append(f'"{name}" = ?')
        params.append(value)
    sql = f'SELECT COUNT(*) FROM "{schema.name}" WHERE {" AND ".join(where)}'  # noqa: S608
    return int(conn.execute(sql, params).fetchone()[0])


def read_keys(
    conn: sqlite3.Connection, schema: RecordSchema, keys: Sequence[RecordKey]
) -> list[dict[str, Any]]:
    """The records with these keys, in the order asked; absent keys are left out."""
    found: dict[Any, dict[str, Any]] = {}
    for start in range(0, len(keys), 500):
        chunk = list(keys[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        sql = f'{select_sql(schema)} WHERE "{schema.key}" IN ({marks})'
        for row in conn.execute(sql, chunk):
            record = row_to_record(schema, row)
            found[record[schema.key]] = record
    return [found[key] for key in dict.fromkeys(keys) if key in found]


def read_only_uri(path: Path) -> str:
    """A URI that opens `path` read-only (safe for any characters in the path)."""
    return f"{Path(path).resolve().as_uri()}?mode=ro"


def write_snapshot(
    source: Path, options: StoreOptions, schema: RecordSchema, target: Path
) -> SnapshotInfo:
    """VACUUM INTO a temp file beside `target`, fsync, rename into place, fsync the directory.

    Uses its own connection, so the store's reads and writes go on meanwhile.
    """
    target = Path(target)
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(source, timeout=options.busy_timeout_s)) as conn:
            conn.execute("VACUUM INTO ?", (str(temp),))
        with contextlib.closing(sqlite3.connect(read_only_uri(temp), uri=True)) as copy:
            records = int(copy.execute(f'SELECT COUNT(*) FROM "{schema.name}"').fetchone()[0])  # noqa: S608
        with open(temp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temp, target)
        fsync_directory(target.parent)
        return SnapshotInfo(str(target), records, target.stat().st_size)
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise SnapshotError(f"{target}: cannot write snapshot: {exc}") from exc


def open_snapshot(path: Path, schema: RecordSchema) -> sqlite3.Connection:
    """A read-only connection to a snapshot that passed PRAGMA integrity_check and has the table."""
    if not Path(path).is_file():
        raise SnapshotError(f"{path}: no such snapshot file")
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise SnapshotError(f"{path}: cannot open snapshot: {exc}") from exc
    try:
        problems = [str(row[0]) for row in conn.execute("PRAGMA integrity_check(20)")]
        if problems != ["ok"]:
            raise SnapshotError(f"{path}: integrity check failed: {'; '.join(problems[:5])}")
        problem = column_problem(conn, schema)
        if problem:
            raise SnapshotError(f"{path}: {problem}")
    except sqlite3.Error as exc:
        conn.close()
        raise SnapshotError(f"{path}: not a readable SQLite database: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def iter_snapshot_records(
    conn: sqlite3.Connection, schema: RecordSchema, chunk: int = 5000
) -> Iterator[list[dict[str, Any]]]:
    """The snapshot's records in (time, key) order, `chunk` at a time."""
    query = SinceQuery(limit=chunk)
    while True:
        try:
            page = read_page(conn, schema, query)
        except (sqlite3.Error, ValueError) as exc:
            raise SnapshotError(f"cannot read snapshot rows: {exc}") from exc
        if page.records:
            yield page.records
        if page.next is None:
            return
        query = SinceQuery(ts=page.next[0], after=page.next[1], limit=chunk)
