"""WriteAheadLog: the durable operation log and the node's small durable state.

Writes go through the group-commit writer (writer.py); reads use their own connection and thread.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from config.closing import AsyncClosing
from wal.batch import (
    CleanupRequest,
    StateSetRequest,
    TransitionRequest,
    new_append,
)
from wal.entry import (
    MAX_ENTRY_TYPE_CHARS,
    MAX_KEY_CHARS,
    EntryState,
    RecoveryHandler,
    RecoveryResult,
    WalConfig,
    WalEntry,
    WalObserver,
    WalStats,
    as_payload,
    check_name,
    encode_json,
)
from wal.errors import WalError, WalFullError, translate
from wal.recovery import RecoveryOps, describe_pending, run_recovery
from wal.schema import (
    claim,
    open_read_connection,
    read_entries_of,
    read_entry,
    read_pending,
    read_state,
    read_stats,
    release,
)
from wal.writer import BatchWriter

logger = logging.getLogger(__name__)

T = TypeVar("T")
CLEANUP_CHUNK = 10_000


class _Lifecycle(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class WriteAheadLog(AsyncClosing):
    """The write-ahead log in one SQLite file, opened once and closed once.

    Every write returns only after its transaction committed with synchronous=FULL, so an
    acknowledged entry survives a crash or power loss. A second WriteAheadLog on the same file
    in this process is refused (WalError); other processes (the CLI) may open the same file
    safely, since ids and counters are read and written inside each write transaction.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        config: WalConfig | None = None,
        observer: WalObserver | None = None,
    ) -> None:
        self._path = Path(path).absolute()
        self._config = config if config is not None else WalConfig()
        self._observer = observer
        self._state = _Lifecycle.UNOPENED
        self._lifecycle_lock = asyncio.Lock()
        self._recovery_lock = asyncio.Lock()
        self._writer: BatchWriter | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._read_conn: sqlite3.Connection | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._claimed = False

    @property
    def path(self) -> Path:
        return self._path

    @property
    def config(self) -> WalConfig:
        return self._config

    async def _enter(self) -> None:
        await self.open()

    async def open(self) -> None:
        """Open (creating when absent) and validate the file; log pending entries.

        Raises WalCorruptError for a file that is not a shoal WAL or fails its quick check.
        """
        async with self._lifecycle_lock:
            if self._state is not _Lifecycle.UNOPENED:
                raise WalError(f"{self._path}: write-ahead log was already opened")
            claim(self._path.resolve())
            self._claimed = True
            try:
                self._writer = BatchWriter(self._path, self._config, self._observer)
                await self._writer.open()
                self._reader = ThreadPoolExecutor(1, thread_name_prefix="wal-reader")
                self._read_conn = await self._read(
                    open_read_connection, "opening", self._path, self._config
                )
                self._state = _Lifecycle.OPEN
                stats = await self.stats()
            except BaseException:
                self._state = _Lifecycle.CLOSED
                await self._release()
                raise
        logger.info(
            "WAL %s opened: %s",
            self._path,
            describe_pending(stats.pending, stats.oldest_pending_age_s),
        )

    async def close(self) -> None:
        """Write what is queued, checkpoint and close; the log cannot be reopened.

        Idempotent: only the first call raises when closing fails; later calls just wait for it.
        """
        first = False
        async with self._lifecycle_lock:
            if self._state is _Lifecycle.UNOPENED:
                self._state = _Lifecycle.CLOSED
            if self._state is _Lifecycle.OPEN:
                self._state = _Lifecycle.CLOSED
                self._close_task = asyncio.create_task(self._release(), name="wal-close")
                first = True
        task = self._close_task
        if task is None:
            return
        if first:
            await asyncio.shield(task)
            return
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            logger.debug("WAL %s: closing had failed: %s", self._path, task.exception())

    async def _release(self) -> None:
        """Free everything open() acquired, in reverse order; safe after a partial open."""
        try:
            if self._writer is not None:
                await self._writer.close()
        finally:
            try:
                if self._read_conn is not None and self._reader is not None:
                    await self._read(self._read_conn.close, "closing")
            finally:
                self._read_conn = None
                if self._reader is not None:
                    self._reader.shutdown(wait=False)
                if self._claimed:
                    release(self._path.resolve())
                    self._claimed = False

    async def append(
        self, entry_type: str, payload: Mapping[str, Any], *, key: str | None = None
    ) -> int:
        """Log an operation as pending and return its id once it is durable on disk.

        With `key`, an entry already logged under that key is not duplicated: its id is returned.
        Raises WalFullError over max_pending pending entries, WalError for a payload over
        max_payload_bytes or that is not JSON, and WalError once closed.
        """
        started = time.perf_counter()
        writer = self._writer
        if self._state is not _Lifecycle.OPEN or writer is None:
            writer = self._open_writer()
        if entry_type.__class__ is not str or not 0 < len(entry_type) <= MAX_ENTRY_TYPE_CHARS:
            check_name("entry_type", entry_type, MAX_ENTRY_TYPE_CHARS)
        if key is not None:
            check_name("key", key, MAX_KEY_CHARS)
        if payload.__class__ is not dict:
            payload = as_payload(payload)
        payload_json = encode_json(payload, "payload")
        if len(payload_json) > self._config.max_payload_bytes:
            raise WalError(
                f"payload of {entry_type!r} is {len(payload_json)} bytes, over the "
                f"max_payload_bytes limit of {self._config.max_payload_bytes}"
            )
        pending = writer.pending_count + writer.appends_in_flight
        if pending >= self._config.max_pending:
            raise WalFullError(
                f"{self._path}: {pending} entries pending, at the max_pending limit of "
                f"{self._config.max_pending}; finish entries before appending more",
                pending=pending,
            )
        if writer.full:
            await writer.wait_for_room()
        request = new_append((entry_type, key, payload_json, time.time()))
        result = await writer.enqueue_append(request)
        if self._observer is not None:
            try:
                self._observer.on_append(time.perf_counter() - started)
            except Exception:
                logger.exception("WAL %s: observer.on_append failed", self._path)
        return result  # type: ignore[return-value]

    async def commit(self, entry_id: int) -> None:
        """Mark a pending entry committed. Committing a committed entry again is harmless."""
        await self._finish(entry_id, EntryState.COMMITTED, None, "commit")

    async def rollback(self, entry_id: int, *, reason: str = "") -> None:
        """Mark a pending entry rolled back, keeping `reason` as its error."""
        await self._finish(entry_id, EntryState.ROLLED_BACK, reason or None, "roll back")

    async def fail(self, entry_id: int, *, error: str) -> EntryState:
        """Count a failed try of a pending entry; returns FAILED once max_retries is reached,
        else PENDING. Raises WalError when the entry is missing or already finished."""
        state, changed = await self._transition(entry_id, EntryState.FAILED, error)
        if not changed:
            raise WalError(f"WAL entry {entry_id} is already {state.value}; cannot fail it")
        return state

    async def pending(
        self, entry_type: str | None = None, *, limit: int | None = None
    ) -> list[WalEntry]:
        """Pending entries, oldest first, optionally only of `entry_type`, at most `limit`."""
        return await self._read(read_pending, "listing pending", self._conn(), entry_type, 0, limit)

    async def entries_of(
        self,
        entry_types: tuple[str, ...],
        *,
        since: float = 0.0,
        after_id: int = 0,
        limit: int = 1000,
    ) -> list[WalEntry]:
        """Entries of `entry_types` in any state, created at or after `since` (unix seconds)
        with id > `after_id`, oldest first, at most `limit`: a page of the log's history."""
        return await self._read(
            read_entries_of, "listing entries", self._conn(), entry_types, since, after_id, limit
        )

    async def get(self, entry_id: int) -> WalEntry | None:
        """The entry with `entry_id` in whatever state, or None (never logged, or cleaned up)."""
        return await self._read(read_entry, "reading an entry", self._conn(), entry_id)

    async def cleanup(self, older_than_s: float = 86400) -> int:
        """Delete finished entries last updated more than `older_than_s` ago; returns how many.

        Pending entries are never removed; keys of removed entries may be appended again.
        Deletes in chunks so appends keep flowing.
        """
        writer = self._open_writer()
        cutoff = time.time() - older_than_s
        removed = 0
        while True:
            chunk = await writer.submit(CleanupRequest(cutoff, CLEANUP_CHUNK))
            assert isinstance(chunk, int)
            removed += chunk
            if chunk < CLEANUP_CHUNK:
                return removed

    async def stats(self) -> WalStats:
        """Counts, lifetime totals and file sizes; see WalStats."""
        writer = self._open_writer()
        return await self._read(
            read_stats, "reading stats", self._conn(), self._path, writer.queue_depth
        )

    async def recover(self, handlers: Mapping[str, RecoveryHandler]) -> RecoveryResult:
        """Run each pending entry's handler by entry_type: success commits the entry, an
        exception counts a retry (fail), an unknown type stays pending. Safe to run again."""
        writer = self._open_writer()
        ops = RecoveryOps(
            read_page=self._pending_page,
            finish=self._finish_recovered,
            fail=self._fail_recovered,
        )
        async with self._recovery_lock:
            return await run_recovery(ops, handlers, up_to_id=writer.last_id)

    async def state_get(self, key: str, default: Any = None) -> Any:
        """The JSON value stored under `key`, or `default`."""
        text = await self._read(read_state, "reading state", self._conn(), key)
        return default if text is None else json.loads(text)

    async def state_set(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under `key`; durable when this returns."""
        writer = self._open_writer()
        check_name("state key", key, MAX_KEY_CHARS)
        await writer.submit(StateSetRequest(key, encode_json(value, f"state {key!r}")))

    async def _finish(
        self, entry_id: int, target: EntryState, error: str | None, verb: str
    ) -> None:
        state, _ = await self._transition(entry_id, target, error)
        if state is not target:
            raise WalError(f"WAL entry {entry_id} is already {state.value}; cannot {verb} it")

    async def _transition(
        self, entry_id: int, target: EntryState, error: str | None
    ) -> tuple[EntryState, bool]:
        result = await self._open_writer().submit(TransitionRequest(entry_id, target, error))
        assert isinstance(result, tuple)
        return result

    async def _pending_page(self, after_id: int, limit: int) -> list[WalEntry]:
        return await self._read(
            read_pending, "listing pending", self._conn(), None, after_id, limit
        )

    async def _finish_recovered(self, entry_id: int) -> EntryState:
        return (await self._transition(entry_id, EntryState.COMMITTED, None))[0]

    async def _fail_recovered(self, entry_id: int, error: str) -> EntryState:
        return (await self._transition(entry_id, EntryState.FAILED, error))[0]

    def _open_writer(self) -> BatchWriter:
        if self._state is _Lifecycle.UNOPENED:
            raise WalError(f"{self._path}: write-ahead log is not open; use `async with` or open()")
        if self._state is _Lifecycle.CLOSED or self._writer is None:
            raise WalError(f"{self._path}: write-ahead log is closed")
        return self._writer

    def _conn(self) -> sqlite3.Connection:
        self._open_writer()
        assert self._read_conn is not None
        return self._read_conn

    async def _read(self, fn: Callable[..., T], doing: str, *args: object) -> T:
        assert self._reader is not None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._config.op_timeout_s):
                return await loop.run_in_executor(self._reader, fn, *args)
        except TimeoutError as exc:
            raise WalError(
                f"{self._path}: {doing} timed out after {self._config.op_timeout_s} s"
            ) from exc
        except (sqlite3.Error, OSError) as exc:
            raise translate(exc, self._path, doing) from exc
        except ValueError as exc:
            raise WalError(f"{self._path}: {doing} found invalid stored JSON: {exc}") from exc
