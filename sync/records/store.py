"""RecordStore: one SQLite database of records, written by one thread with group commit.

Invariant: a request's rows are never split across transactions, and it is answered only after
the transaction holding them committed (synchronous=FULL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import errno
import fcntl
import logging
import math
import os
import queue
import sqlite3
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from health import DiskWrites
from sync.errors import (
    SnapshotError,
    StoreBusyError,
    StoreClosedError,
    StoreFullError,
    StoreLockedError,
    StoreWriteError,
    SyncError,
    free_bytes,
    sync_error,
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

logger = logging.getLogger(__name__)

T = TypeVar("T")
_Job = tuple[Sequence[db.Row], "asyncio.Future[IngestResult]"]
_Outcome = list[IngestResult | BaseException]


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class RecordStore:
    """Owns `path` (exclusively, by a lock file), its writer thread and its reader connection."""

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
        self._insert = insert_sql(schema)
        self._state = _State.UNOPENED
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._pending = 0
        self._count = 0
        self._newest: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: threading.Thread | None = None
        self._writer_done: concurrent.futures.Future[None] = concurrent.futures.Future()
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

    async def __aenter__(self) -> RecordStore:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Lock and open the database (creating it), start the writer and the reader."""
        if self._state is not _State.UNOPENED:
            raise StoreClosedError(f"record store {self.name!r} was already opened")
        self._loop = asyncio.get_running_loop()
        self._state = _State.OPEN
        ready: concurrent.futures.Future[tuple[int, Any]] = concurrent.futures.Future()
        try:
            self._lock_fd = await self._read(self._take_lock)
            self._writer = threading.Thread(
                target=self._write_loop,
                args=(ready,),
                name=f"records-{self.name}-writer",
                daemon=True,
            )
            self._writer.start()
            self._count, self._newest = await asyncio.wrap_future(ready)
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
            self._jobs.put(None)
            await asyncio.wrap_future(self._writer_done)
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
        future: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._jobs.put((rows, future))
        return await future

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

    def _write_loop(self, ready: concurrent.futures.Future[tuple[int, Any]]) -> None:
        conn: sqlite3.Connection | None = None
        try:
            try:
                conn = db.connect(self.path, self.options, writer=True)
                ready.set_result(db.prepare_table(conn, self.schema, self.path))
            except (sqlite3.Error, OSError, SyncError) as exc:
                ready.set_exception(_write_error(self.path, "cannot open", exc))
                return
            self._serve(conn)
        finally:
            try:
                if conn is not None:
                    db.checkpoint(conn, "TRUNCATE", str(self.path))
                    conn.close()
            finally:
                self._writer_done.set_result(None)

    def _serve(self, conn: sqlite3.Connection) -> None:
        dirty = False
        while True:
            try:
                job = self._jobs.get(timeout=self.options.idle_checkpoint_s if dirty else None)
            except queue.Empty:
                db.checkpoint(conn, "TRUNCATE", str(self.path))
                dirty = False
                continue
            if job is None:
                return
            batch = [job]
            size = len(job[0])
            stop = False
            while size < self.options.max_batch_records:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
                size += len(more[0])
            self._apply(conn, batch)
            dirty = True
            if stop:
                return

    def _apply(self, conn: sqlite3.Connection, batch: list[_Job]) -> None:
        outcome: _Outcome
        try:
            outcome = list(db.commit_jobs(conn, self._insert, [rows for rows, _ in batch]))
        except Exception as exc:  # one bad job must not fail the others: retry each alone
            if len(batch) == 1:
                outcome = [_write_error(self.path, "cannot commit", exc)]
            else:
                outcome = []
                for rows, _ in batch:
                    try:
                        outcome.extend(db.commit_jobs(conn, self._insert, [rows]))
                    except Exception as one_exc:
                        outcome.append(_write_error(self.path, "cannot commit", one_exc))
        newest: Any = None
        with contextlib.suppress(sqlite3.Error):
            newest = db.newest_time(conn, self.schema)
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self._loop.call_soon_threadsafe(self._complete, batch, outcome, newest)

    def _complete(self, batch: list[_Job], outcome: _Outcome, newest: Any) -> None:
        self._report_writes(outcome)
        for (rows, future), result in zip(batch, outcome, strict=True):
            self._pending -= len(rows)
            if isinstance(result, IngestResult):
                self._count += result.accepted
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        if newest is not None:
            self._newest = float(newest)
        self._wake()

    def _report_writes(self, outcome: _Outcome) -> None:
        if self._writes is None:
            return
        failed = [result for result in outcome if isinstance(result, StoreWriteError)]
        if not failed:
            self._writes.succeeded(self.path)
            return
        error = failed[-1]
        if isinstance(error, StoreFullError):
            self._writes.failed(self.path, "the disk is full", error.free_bytes)
        else:
            self._writes.failed(self.path, str(error), free_bytes(self.path))

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

    async def get(self, keys: Sequence[RecordKey]) -> list[dict[str, Any]]:
        """The records with these keys (absent ones left out), in the order asked."""
        found: list[dict[str, Any]] = await self._read(
            db.read_keys, self._reader_connection(), self.schema, keys
        )
        return found

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
