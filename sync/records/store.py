"""RecordStore: one SQLite database of records, written by one thread with group commit.

Invariant: a request's rows are never split across transactions, and it is answered only after
the transaction holding them committed (synchronous=FULL).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import fcntl
import functools
import logging
import math
import os
import sqlite3
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.closing import AsyncClosing
from health import DiskWrites
from sync.errors import (
    SnapshotError,
    StoreBusyError,
    StoreClosedError,
    StoreFullError,
    StoreLockedError,
    StoreWriteError,
    SyncError,
)
from sync.records import sqlite as db
from sync.records.schema import RecordSchema, insert_sql
from sync.records.types import (
    IngestResult,
    RecordKey,
    RecordPage,
    SinceQuery,
    SnapshotInfo,
    StoreOptions,
    StoreStatus,
)
from sync.records.validate import validate_records
from sync.translate import free_bytes, sync_error
from wal import GroupCommit, GroupCommitConfig

logger = logging.getLogger(__name__)

_Rows = Sequence[db.Row]


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class _Committed:
    """A batch of ingest requests applied: each one's result or error, and the newest time."""

    results: list[IngestResult | Exception]
    newest: Any


class _RecordWriter(GroupCommit[_Rows, _Committed]):
    """The store's group commit: each request is one ingest's rows, weighed by their number;
    a batch is one INSERT OR IGNORE transaction, retried request by request if it fails."""

    unit_weight = False

    def __init__(self, store: RecordStore) -> None:
        super().__init__(
            f"record store {store.name}",
            GroupCommitConfig(
                max_batch=store.options.max_batch_records,
                idle_checkpoint_s=store.options.idle_checkpoint_s,
                eager=True,
            ),
            closed_reason="closed",
            thread_name=f"records-{store.name}-writer",
        )
        self._store = store

    def weight(self, request: _Rows) -> int:
        return len(request)

    def apply(self, conn: sqlite3.Connection, requests: list[_Rows]) -> _Committed:
        path, insert = self._store.path, self._store.insert
        results: list[IngestResult | Exception]
        try:
            results = list(db.commit_jobs(conn, insert, requests))
        except Exception as exc:  # one bad request must not fail the others: retry each alone
            if len(requests) == 1:
                results = [_write_error(path, "cannot commit", exc)]
            else:
                results = []
                for rows in requests:
                    try:
                        results.extend(db.commit_jobs(conn, insert, [rows]))
                    except Exception as one_exc:
                        results.append(_write_error(path, "cannot commit", one_exc))
        newest: Any = None
        with contextlib.suppress(sqlite3.Error):
            newest = db.newest_time(conn, self._store.schema)
        return _Committed(results, newest)

    def checkpoint(self, conn: sqlite3.Connection, mode: str) -> None:
        db.checkpoint(conn, mode, str(self._store.path))

    def translate(self, exc: sqlite3.Error | OSError, doing: str) -> Exception:
        what = {"opening": "cannot open", "writing": "cannot commit"}.get(doing, f"{doing} failed")
        return _write_error(self._store.path, what, exc)

    def failure(self, reason: str) -> Exception:
        return StoreWriteError(f"{self._store.path}: {reason}")

    def on_batch(self, requests: list[_Rows], outcome: _Committed | None) -> None:
        self._store.committed(requests, outcome)


class RecordStore(AsyncClosing):
    """Owns `path` (exclusively, by a lock file), its writer (the WAL package's group commit)
    and its reader connection."""

    def __init__(
        self,
        path: Path,
        schema: RecordSchema,
        options: StoreOptions | None = None,
        writes: DiskWrites | None = None,
    ) -> None:
        """`writes` hears of every failed and succeeded commit (the node's disk health)."""
        self.path = Path(path)
        self._writes = writes
        self.schema = schema
        self.options = options or StoreOptions()
        self.insert = insert_sql(schema)
        self._state = _State.UNOPENED
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._pending = 0
        self._count = 0
        self._newest: float | None = None
        self._writer: _RecordWriter | None = None
        self._reader = ThreadPoolExecutor(1, thread_name_prefix=f"records-{schema.name}-reader")
        self._reader_conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._closing: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def pending_records(self) -> int:
        """Records admitted and not yet committed."""
        return self._pending

    async def _enter(self) -> None:
        await self.open()

    async def open(self) -> None:
        """Lock and open the database (creating it), start the writer and the reader."""
        if self._state is not _State.UNOPENED:
            raise StoreClosedError(f"record store {self.name!r} was already opened")
        self._state = _State.OPEN
        try:
            self._lock_fd = await self._read(self._take_lock)
            self._writer = writer = _RecordWriter(self)
            await writer.open_connection(
                functools.partial(db.connect, writer=True), self.path, self.options
            )
            self._count, self._newest = await writer.call(
                db.prepare_table, "opening", writer.connection, self.schema, self.path
            )
            writer.start()
            self._reader_conn = await self._read(db.connect, self.path, self.options, writer=False)
        except BaseException:
            await asyncio.shield(self.close())
            raise
        logger.info("record store %s open at %s with %s records", self.name, self.path, self._count)

    def _take_lock(self) -> int:
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = -1
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreLockedError(self.path, lock_path) from exc
            raise sync_error(
                exc, f"{self.path}: cannot lock", StoreWriteError, path=self.path
            ) from exc
        return fd

    async def close(self) -> None:
        """Refuse new work, commit what was admitted, TRUNCATE-checkpoint and close. Idempotent."""
        if self._closing is None:
            was_open = self._state is _State.OPEN
            self._state = _State.CLOSED
            self._fail_waiters()
            # owned by the store: a caller cancelled mid-close does not stop the drain
            self._closing = asyncio.get_running_loop().create_task(self._shutdown(was_open))
        await asyncio.shield(self._closing)

    async def _shutdown(self, was_open: bool) -> None:
        if not was_open:
            self._reader.shutdown(wait=False)
            return
        if self._writer is not None:
            await self._writer.close()
        conn, self._reader_conn = self._reader_conn, None
        if conn is not None:
            await self._read(conn.close)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._reader.shutdown(wait=True)

    # --- writing ------------------------------------------------------------------------------

    async def ingest(
        self, records: Sequence[Any], node_id: str, wait_s: float | None = None
    ) -> IngestResult:
        """Validate `records` (all-or-nothing) and ingest them; see ingest_rows."""
        return await self.ingest_rows(validate_records(self.schema, records, node_id), wait_s)

    async def ingest_rows(
        self, rows: Sequence[db.Row], wait_s: float | None = None
    ) -> IngestResult:
        """Commit validated rows with INSERT OR IGNORE in one transaction; answer after COMMIT.

        Waits up to `wait_s` (default options.max_wait_s) for room in the queue, then raises
        StoreBusyError. StoreClosedError after close(), StoreWriteError if SQLite fails.
        """
        self._check_open()
        if not rows:
            return IngestResult()
        await self._admit(len(rows), self.options.max_wait_s if wait_s is None else wait_s)
        if self._state is not _State.OPEN:  # closed while we waited; close() already sent stop
            self._release(len(rows))
            self._check_open()
        assert self._writer is not None
        result: IngestResult = await self._writer.enqueue(rows)
        return result

    def _check_open(self) -> None:
        if self._state is not _State.OPEN:
            raise StoreClosedError(f"record store {self.name!r} is {self._state.value}")

    def _fits(self, count: int) -> bool:
        return self._pending == 0 or self._pending + count <= self.options.max_pending_records

    async def _admit(self, count: int, wait_s: float) -> None:
        if not self._waiters and self._fits(count):
            self._pending += count
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((count, waiter))
        try:
            async with asyncio.timeout(None if math.isinf(wait_s) else wait_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(count)  # admitted in the same instant it gave up: give room back
            else:
                waiter.cancel()
                self._wake()
            if isinstance(exc, TimeoutError):
                raise StoreBusyError(self.name, self.options.retry_after_s) from None
            raise

    def _release(self, count: int) -> None:
        self._pending -= count
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            count, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._fits(count):
                return
            self._waiters.popleft()
            self._pending += count
            waiter.set_result(None)

    def _fail_waiters(self) -> None:
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(StoreClosedError(f"record store {self.name!r} closed"))

    def committed(self, requests: list[_Rows], outcome: _Committed | None) -> None:
        """Account a finished batch (called by its writer): pending, count, newest, waiters."""
        results = outcome.results if outcome is not None else [None] * len(requests)
        self._report_writes(results)
        for rows, result in zip(requests, results, strict=True):
            self._pending -= len(rows)
            if isinstance(result, IngestResult):
                self._count += result.accepted
        if outcome is not None and outcome.newest is not None:
            self._newest = float(outcome.newest)
        self._wake()

    def _report_writes(self, results: Sequence[object]) -> None:
        if self._writes is None:
            return
        failed = [result for result in results if not isinstance(result, IngestResult)]
        if not failed:
            self._writes.succeeded(self.path)
            return
        error = failed[-1]
        if isinstance(error, StoreFullError):
            self._writes.failed(self.path, "the disk is full", error.free_bytes)
        else:
            reason = str(error) if error is not None else "the batch could not be committed"
            self._writes.failed(self.path, reason, free_bytes(self.path))

    # --- reading ------------------------------------------------------------------------------

    async def _read(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._reader, lambda: fn(*args, **kwargs))
        except (sqlite3.Error, OSError) as exc:
            raise _write_error(self.path, "cannot read", exc) from exc

    def _reader_connection(self) -> sqlite3.Connection:
        self._check_open()
        assert self._reader_conn is not None
        return self._reader_conn

    def status(self) -> StoreStatus:
        """Count and newest time (kept by the writer) and the size of the database and its WAL."""
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                size += os.stat(f"{self.path}{suffix}").st_size
        return StoreStatus(self.name, self._count, self._newest, size)

    async def since(self, query: SinceQuery) -> RecordPage:
        """One page of records after the query's cursor, in (time, key) order."""
        page: RecordPage = await self._read(
            db.read_page, self._reader_connection(), self.schema, query
        )
        return page

    async def since_json(self, query: SinceQuery) -> bytes:
        """`since` as a JSON page body, encoded in the reader thread (sqlite.read_page_json)."""
        body: bytes = await self._read(
            db.read_page_json, self._reader_connection(), self.schema, query
        )
        return body

    async def get(self, keys: Sequence[RecordKey]) -> list[dict[str, Any]]:
        """The records with these keys (absent ones left out), in the order asked."""
        found: list[dict[str, Any]] = await self._read(
            db.read_keys, self._reader_connection(), self.schema, keys
        )
        return found

    async def count_range(
        self,
        equals: Sequence[tuple[str, Any]] = (),
        after: tuple[float, RecordKey] | None = None,
        through: tuple[float, RecordKey] | None = None,
    ) -> int:
        """How many records with every `equals` (field, value) lie in (after, through] of the
        (time, key) order (None: open at that end). Costs a scan of that range of the index."""
        count: int = await self._read(
            db.count_range, self._reader_connection(), self.schema, equals, after, through
        )
        return count

    async def snapshot_to(self, path: Path) -> SnapshotInfo:
        """A consistent copy of the store at `path` (VACUUM INTO a temp file, fsync, rename)."""
        self._check_open()
        return await asyncio.to_thread(
            db.write_snapshot, self.path, self.options, self.schema, Path(path)
        )

    async def merge_from(self, path: Path, node_id: str, wait_s: float = math.inf) -> IngestResult:
        """Insert (OR IGNORE) every record of the snapshot at `path`; never replaces the live file.

        The snapshot must pass PRAGMA integrity_check and every row is validated, else
        SnapshotError and nothing more is merged (chunks merged before stay: re-merging is safe).
        """
        self._check_open()
        snapshot = await asyncio.to_thread(db.open_snapshot, Path(path), self.schema)
        total = IngestResult()
        try:
            chunks = db.iter_snapshot_records(snapshot, self.schema)
            while True:
                chunk = await asyncio.to_thread(next, chunks, None)
                if chunk is None:
                    break
                try:
                    rows = validate_records(self.schema, chunk, node_id)
                except SyncError as exc:
                    raise SnapshotError(f"{path}: {exc}") from exc
                total += await self.ingest_rows(rows, wait_s=wait_s)
        finally:
            await asyncio.to_thread(snapshot.close)
        return total


def _write_error(path: Path, what: str, exc: BaseException) -> SyncError:
    error = sync_error(exc, f"{path}: {what}", StoreWriteError, path=path)
    if error is not exc:
        error.__cause__ = exc
    return error
