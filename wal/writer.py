"""Group commit: one task gathers concurrent write requests into batches, and one thread owning
the write connection applies each batch in a single synchronous=FULL transaction (batch.py).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from wal.batch import (
    AppendRequest,
    BatchOutcome,
    Request,
    Result,
    apply_batch,
    checkpoint,
    pending_from,
)
from wal.entry import WalConfig, WalObserver
from wal.errors import WalError, translate
from wal.schema import COUNTER_NAMES, open_write_connection, read_counters

logger = logging.getLogger(__name__)

T = TypeVar("T")
_Item = tuple[Request, "asyncio.Future[Result]"]


class BatchWriter:
    """Owns the write connection, the thread it lives on and the task that batches into it.

    Invariant: requests are applied in the order they were enqueued; a caller's future resolves
    only after the transaction holding its request committed.
    """

    def __init__(self, path: Path, config: WalConfig, observer: WalObserver | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._path = path
        self._config = config
        self._observer = observer
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="wal-writer")
        self._items: deque[_Item] = deque()
        self._items_waiter: asyncio.Future[None] | None = None
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._conn: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: list[list[_Item]] = []
        self._accepting = False
        self._refusal = "write-ahead log is closed"
        self._failing = False
        self.pending_count = 0
        self.appends_in_flight = 0
        self.last_id = 0

    @property
    def queue_depth(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        """True when the queue is at queue_limit; call wait_for_room before enqueue."""
        return len(self._items) >= self._config.queue_limit

    async def open(self) -> None:
        """Open and validate the file, read its counters and start the batching task."""
        opening = self._start(open_write_connection, self._path, self._config)
        self._conn = await self._wait(opening, "opening", self._config.open_timeout_s)
        counters = await self._call(read_counters, "reading counters", self._conn)
        missing = set(COUNTER_NAMES) - counters.keys()
        if missing:
            raise WalError(f"{self._path}: WAL counters {sorted(missing)} are missing")
        self.pending_count = pending_from(counters)
        self.last_id = counters["last_id"]
        self._accepting = True
        self._task = asyncio.create_task(self._run(), name=f"wal-writer {self._path.name}")

    def enqueue(self, request: Request) -> asyncio.Future[Result]:
        """Queue `request`; the future resolves once its batch committed (or with a WalError)."""
        if not self._accepting:
            raise WalError(f"{self._path}: {self._refusal}")
        future: asyncio.Future[Result] = self._loop.create_future()
        self._items.append((request, future))
        if request.__class__ is AppendRequest:
            self.appends_in_flight += 1
        waiter = self._items_waiter
        if waiter is not None:
            self._items_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        return future

    async def submit(self, request: Request) -> Result:
        """Queue `request`, waiting for room first, and wait until its batch committed."""
        if self.full:
            await self.wait_for_room()
        return await self.enqueue(request)

    async def wait_for_room(self) -> None:
        """Backpressure: wait until the queue is below queue_limit (or the log closes)."""
        while self.full and self._accepting:
            room = self._loop.create_future()
            self._room_waiters.append(room)
            await room

    async def close(self) -> None:
        """Write everything queued, stop the task, truncate the -wal file, close the connection."""
        self._accepting = False
        self._wake_room_waiters()
        try:
            if self._task is not None:
                await self._stop_task()
            if self._conn is not None:
                try:
                    await self._call(
                        checkpoint,
                        "checkpointing on close",
                        self._conn,
                        "TRUNCATE",
                        self._config.busy_timeout_s,
                    )
                except WalError as exc:
                    logger.warning("WAL %s: final checkpoint failed: %s", self._path, exc)
                await self._call(self._conn.close, "closing")
        finally:
            self._conn = None
            self._executor.shutdown(wait=False)

    async def _stop_task(self) -> None:
        task = self._task
        assert task is not None
        waiter = self._items_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        done, _ = await asyncio.wait([task], timeout=self._config.op_timeout_s)
        if not done:
            logger.error("WAL %s: writer did not stop in time; cancelling it", self._path)
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            logger.error("WAL %s: writer had stopped on an error", self._path)

    async def _call(self, fn: Callable[..., T], doing: str, *args: object) -> T:
        return await self._wait(self._start(fn, *args), doing)

    def _start(self, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _wait(self, job: asyncio.Future[T], doing: str, timeout_s: float | None = None) -> T:
        limit_s = self._config.op_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(limit_s):
                return await job
        except TimeoutError as exc:
            raise WalError(f"{self._path}: {doing} timed out after {limit_s} s") from exc
        except (sqlite3.Error, OSError) as exc:
            raise translate(exc, self._path, doing) from exc

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_checkpoint = loop.time()
        dirty = False
        job: asyncio.Future[BatchOutcome] | None = None
        try:
            while True:
                if job is None:
                    if not self._items:
                        if not self._accepting:
                            return
                        if not await self._wait_for_items(dirty):
                            await self._checkpoint("TRUNCATE")
                            dirty, last_checkpoint = False, loop.time()
                        continue
                    await self._gather()
                    job = self._start_batch()
                batch = self._in_flight[0]
                outcome = await self._finish_batch(job, batch)
                # With a full batch already waiting, start it before waking the callers of this
                # one: the disk syncs it while the loop serves them. Otherwise wake them first
                # and let them join the next batch, which keeps batches large on slow disks.
                full_batch_waiting = len(self._items) >= self._config.max_batch
                job = self._start_batch() if full_batch_waiting else None
                self._in_flight.pop(0)
                self._resolve(batch, outcome)
                dirty = True
                if loop.time() - last_checkpoint >= self._config.checkpoint_interval_s:
                    await self._checkpoint("PASSIVE")
                    last_checkpoint = loop.time()
        except Exception as exc:
            logger.exception("WAL %s: writer stopped on an unexpected error", self._path)
            self._refusal = f"writer stopped on an unexpected error: {exc!r}"
            raise
        finally:
            self._accepting = False
            closed = WalError(f"{self._path}: {self._refusal}")
            for batch in self._in_flight:
                _fail_items(batch, closed)
            self._in_flight.clear()
            _fail_items(list(self._items), closed)
            self._items.clear()

    async def _wait_for_items(self, dirty: bool) -> bool:
        """Wait for a request; False when idle_checkpoint_s passed first (only when dirty)."""
        waiter = asyncio.get_running_loop().create_future()
        self._items_waiter = waiter
        try:
            async with asyncio.timeout(self._config.idle_checkpoint_s if dirty else None):
                await waiter
        except TimeoutError:
            return False
        finally:
            self._items_waiter = None
        return True

    async def _gather(self) -> None:
        """Let more requests join while they keep arriving, at most max_batch_delay_ms."""
        if self._config.max_batch_delay_ms <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.max_batch_delay_ms / 1000
        seen = len(self._items)
        while seen < self._config.max_batch and loop.time() < deadline:
            await asyncio.sleep(0)
            if len(self._items) == seen:
                return
            seen = len(self._items)

    def _start_batch(self) -> asyncio.Future[BatchOutcome]:
        batch: list[_Item] = []
        for _ in range(min(len(self._items), self._config.max_batch)):
            batch.append(self._items.popleft())
        self._in_flight.append(batch)
        self._wake_room_waiters()
        requests = [request for request, _ in batch]
        return self._start(apply_batch, self._conn, requests, self._config.max_retries, time.time())

    async def _finish_batch(
        self, job: asyncio.Future[BatchOutcome], batch: list[_Item]
    ) -> BatchOutcome | WalError:
        appends = sum(1 for request, _ in batch if request.__class__ is AppendRequest)
        try:
            return await self._wait(job, "writing")
        except WalError as exc:
            self._record_failure(exc)
            return exc
        except Exception as exc:
            logger.exception("WAL %s: unexpected error writing a batch", self._path)
            return WalError(f"{self._path}: writing failed: {exc!r}")
        finally:
            self.appends_in_flight -= appends

    def _resolve(self, batch: list[_Item], outcome: BatchOutcome | WalError) -> None:
        if isinstance(outcome, WalError):
            _fail_items(batch, outcome)
            return
        if self._failing:
            logger.warning("WAL %s: writes succeed again", self._path)
            self._failing = False
        for (_, future), result in zip(batch, outcome.results, strict=True):
            if future.done():
                continue
            if result.__class__ is WalError:
                future.set_exception(result)
            else:
                future.set_result(result)
        self.pending_count = pending_from(outcome.counters)
        self.last_id = outcome.counters["last_id"]
        if self._observer is not None:
            try:
                self._observer.on_pending(self.pending_count)
            except Exception:
                logger.exception("WAL %s: observer.on_pending failed", self._path)

    def _wake_room_waiters(self) -> None:
        while self._room_waiters:
            room = self._room_waiters.popleft()
            if not room.done():
                room.set_result(None)

    def _record_failure(self, exc: WalError) -> None:
        if not self._failing:
            logger.warning("WAL %s: a batch failed: %s", self._path, exc)
            self._failing = True
        else:
            logger.debug("WAL %s: a batch failed: %s", self._path, exc)

    async def _checkpoint(self, mode: str) -> None:
        try:
            busy, frames, copied = await self._call(
                checkpoint, f"{mode} checkpoint", self._conn, mode, self._config.busy_timeout_s
            )
        except WalError as exc:
            logger.warning("WAL %s: %s checkpoint failed: %s", self._path, mode, exc)
            return
        logger.debug(
            "WAL %s: %s checkpoint busy=%s frames=%s copied=%s",
            self._path,
            mode,
            busy,
            frames,
            copied,
        )


def _fail_items(items: list[_Item], exc: WalError) -> None:
    for _, future in items:
        if not future.done():
            future.set_exception(WalError(str(exc)))
