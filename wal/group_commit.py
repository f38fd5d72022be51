"""Group commit: one task gathers concurrent write requests into batches, and one thread owning
a SQLite write connection applies each batch in a single transaction. The WAL's writer and
sync's record stores are both built on it; a subclass says how a batch is applied.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from wal.runner import ThreadRunner, wait_within

__all__ = ["BatchResults", "GroupCommit", "GroupCommitConfig"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Req = TypeVar("Req")


class BatchResults(Protocol):
    """What applying a batch returns: one result per request, in order; an exception instance
    fails its request alone."""

    @property
    def results(self) -> Sequence[object]: ...


Out = TypeVar("Out", bound=BatchResults)


@dataclass(frozen=True)
class GroupCommitConfig:
    """How batches are formed and how long the thread may take. Times in seconds; None: no limit.

    A batch takes queued requests while their total weight is below `max_batch` (so one heavy
    request always fits), gathering for at most `max_batch_delay_ms` while more keep arriving.
    `queue_limit` bounds the requests queued and not yet in a batch (see wait_for_room).
    `op_timeout_s` bounds each batch and call, and how long close() waits for the queue to drain.
    After `idle_checkpoint_s` without writes the SQLite -wal file is truncated; while busy a
    PASSIVE checkpoint runs every `checkpoint_interval_s`. When a batch finishes, the next one
    starts before its callers are woken if a full batch waits; otherwise they are woken first
    and may join it (larger batches on slow disks). With `eager` the thread applies batch after
    batch while requests wait, never waiting for the loop in between (for owners whose loop is
    busy with other work); op_timeout_s then bounds only calls, not batches.
    """

    max_batch: int
    max_batch_delay_ms: float = 0.0
    queue_limit: int | None = None
    op_timeout_s: float | None = None
    open_timeout_s: float | None = None
    idle_checkpoint_s: float | None = None
    checkpoint_interval_s: float | None = None
    eager: bool = False


class GroupCommit(Generic[Req, Out]):
    """Owns the write connection, the thread it lives on and the task that batches into it.

    Invariant: requests are applied in the order they were enqueued; a caller's future resolves
    only after the transaction holding its request committed. Subclasses implement `apply`,
    `checkpoint`, `translate` and `failure`, and may override `weight`, `copy_error` and
    `on_batch`.
    """

    unit_weight = True
    """True when every request weighs 1 (a subclass overriding `weight` sets it False)."""

    def __init__(
        self, label: str, config: GroupCommitConfig, *, closed_reason: str, thread_name: str
    ) -> None:
        self._label = label
        self._commit_config = config
        self._loop = asyncio.get_running_loop()
        self._runner = ThreadRunner(self._loop, thread_name)
        self._items: deque[tuple[Req, asyncio.Future[Any]]] = deque()
        self._items_waiter: asyncio.Future[None] | None = None
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._conn: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: list[list[tuple[Req, asyncio.Future[Any]]]] = []
        self._accepting = False
        self._refusal = closed_reason
        self._failing = False

    # --- what a subclass says -----------------------------------------------------------------

    def apply(self, conn: sqlite3.Connection, requests: list[Req]) -> Out:
        """Apply `requests` in one transaction and commit; runs on the writer's thread."""
        raise NotImplementedError

    def checkpoint(self, conn: sqlite3.Connection, mode: str) -> None:
        """Run a PASSIVE or TRUNCATE checkpoint on the writer's thread."""
        raise NotImplementedError

    def translate(self, exc: sqlite3.Error | OSError, doing: str) -> Exception:
        """The owner's error for a SQLite or OS error while `doing`; the caller chains it."""
        raise NotImplementedError

    def failure(self, reason: str) -> Exception:
        """The owner's error for anything else that fails a request (closed, timed out)."""
        raise NotImplementedError

    def copy_error(self, error: Exception) -> Exception:
        """The error given to each request of a batch that failed as a whole (by default the
        same instance for all)."""
        return error

    def weight(self, request: Req) -> int:
        """How much of a batch's `max_batch` the request takes."""
        return 1

    def on_batch(self, requests: list[Req], outcome: Out | None) -> None:
        """Called on the loop once a batch finished, after its callers' futures were resolved;
        `outcome` is None when the whole batch failed."""

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def connection(self) -> sqlite3.Connection:
        assert self._conn is not None, "open() first"
        return self._conn

    @property
    def queue_depth(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        """True when the queue is at queue_limit; call wait_for_room before enqueue."""
        limit = self._commit_config.queue_limit
        return limit is not None and len(self._items) >= limit

    async def open_connection(self, opener: Callable[..., sqlite3.Connection], *args: Any) -> None:
        """Open the write connection with `opener(*args)` on the writer's thread."""
        opening = self._start(opener, *args)
        self._conn = await self._wait(opening, "opening", self._commit_config.open_timeout_s)

    def start(self) -> None:
        """Accept requests and start the batching task (after open_connection)."""
        self._accepting = True
        self._task = asyncio.create_task(self._run(), name=f"group commit {self._label}")

    async def call(self, fn: Callable[..., T], doing: str, *args: Any) -> T:
        """`fn(*args)` on the writer's thread, errors translated, within op_timeout_s."""
        return await self._wait(self._start(fn, *args), doing)

    def enqueue(self, request: Req) -> asyncio.Future[Any]:
        """Queue `request`; the future resolves once its batch committed (or with an error)."""
        if not self._accepting:
            raise self.failure(self._refusal)
        future: asyncio.Future[Any] = asyncio.Future(loop=self._loop)
        self._items.append((request, future))
        waiter = self._items_waiter
        if waiter is not None:
            self._items_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        return future

    async def submit(self, request: Req) -> Any:
        """Queue `request`, waiting for room first, and wait until its batch committed."""
        if self.full:
            await self.wait_for_room()
        return await self.enqueue(request)

    async def wait_for_room(self) -> None:
        """Backpressure: wait until the queue is below queue_limit (or the writer closes)."""
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
                    await self.call(
                        self.checkpoint, "checkpointing on close", self._conn, "TRUNCATE"
                    )
                except Exception as exc:
                    logger.warning("%s: final checkpoint failed: %s", self._label, exc)
                await self.call(self._conn.close, "closing")
        finally:
            self._conn = None
            self._runner.shutdown()

    async def _stop_task(self) -> None:
        task = self._task
        assert task is not None
        waiter = self._items_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        done, _ = await asyncio.wait([task], timeout=self._commit_config.op_timeout_s)
        if not done:
            logger.error("%s: writer did not stop in time; cancelling it", self._label)
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: writer had stopped on an error", self._label)

    def _start(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return self._runner.submit(fn, *args)

    async def _wait(self, job: asyncio.Future[T], doing: str, timeout_s: float | None = None) -> T:
        limit_s = self._commit_config.op_timeout_s if timeout_s is None else timeout_s
        try:
            return await wait_within(job, limit_s)
        except TimeoutError as exc:
            raise self.failure(f"{doing} timed out after {limit_s} s") from exc
        except (sqlite3.Error, OSError) as exc:
            raise self.translate(exc, doing) from exc

    # --- the batching task --------------------------------------------------------------------

    async def _run(self) -> None:
        config = self._commit_config
        last_checkpoint = self._loop.time()
        dirty = False
        job: asyncio.Future[Out] | None = None
        try:
            while True:
                if job is None:
                    if not self._items:
                        if not self._accepting:
                            return
                        if not await self._wait_for_items(dirty):
                            await self._checkpoint("TRUNCATE")
                            dirty, last_checkpoint = False, self._loop.time()
                        continue
                    await self._gather()
                    if config.eager:
                        await self._start(self._apply_while_queued)
                        dirty = True
                        continue
                    job = self._start_batch()
                batch = self._in_flight[0]
                outcome = await self._finish_batch(job)
                # With a full batch already waiting, start it before waking the callers of this
                # one: the disk syncs it while the loop serves them. Otherwise wake them first
                # and let them join the next batch, which keeps batches large on slow disks.
                job = self._start_batch() if self._full_batch_waiting() else None
                self._in_flight.pop(0)
                self._resolve(batch, outcome)
                dirty = True
                interval = config.checkpoint_interval_s
                if interval is not None and self._loop.time() - last_checkpoint >= interval:
                    await self._checkpoint("PASSIVE")
                    last_checkpoint = self._loop.time()
        except Exception as exc:
            logger.exception("%s: writer stopped on an unexpected error", self._label)
            self._refusal = f"writer stopped on an unexpected error: {exc!r}"
            raise
        finally:
            self._accepting = False
            for batch in self._in_flight:
                self._fail_items(batch)
            self._in_flight.clear()
            self._fail_items(list(self._items))
            self._items.clear()

    async def _wait_for_items(self, dirty: bool) -> bool:
        """Wait for a request; False when idle_checkpoint_s passed first (only when dirty)."""
        waiter = self._loop.create_future()
        self._items_waiter = waiter
        try:
            await wait_within(waiter, self._commit_config.idle_checkpoint_s if dirty else None)
        except TimeoutError:
            return False
        finally:
            self._items_waiter = None
        return True

    async def _gather(self) -> None:
        """Let more requests join while they keep arriving, at most max_batch_delay_ms."""
        config = self._commit_config
        if config.max_batch_delay_ms <= 0:
            return
        deadline = self._loop.time() + config.max_batch_delay_ms / 1000
        seen = len(self._items)
        while seen < config.max_batch and self._loop.time() < deadline:
            await asyncio.sleep(0)
            if len(self._items) == seen:
                return
            seen = len(self._items)

    def _full_batch_waiting(self) -> bool:
        limit = self._commit_config.max_batch
        if self.unit_weight:
            return len(self._items) >= limit
        total = 0
        for request, _ in self._items:
            total += self.weight(request)
            if total >= limit:
                return True
        return False

    def _take_batch(self) -> list[tuple[Req, asyncio.Future[Any]]]:
        """The next batch off the queue (deque pops are atomic: the writer's thread may call)."""
        limit = self._commit_config.max_batch
        batch: list[tuple[Req, asyncio.Future[Any]]] = []
        if self.unit_weight:
            for _ in range(min(len(self._items), limit)):
                batch.append(self._items.popleft())
        else:
            total = 0
            while self._items and total < limit:
                item = self._items.popleft()
                total += self.weight(item[0])
                batch.append(item)
        return batch

    def _start_batch(self) -> asyncio.Future[Out]:
        batch = self._take_batch()
        self._in_flight.append(batch)
        self._wake_room_waiters()
        return self._start(self.apply, self._conn, [request for request, _ in batch])

    def _apply_while_queued(self) -> None:
        """On the writer's thread: apply batches back to back while requests wait, handing each
        outcome to the loop."""
        while True:
            batch = self._take_batch()
            if not batch:
                return
            self._loop.call_soon_threadsafe(self._wake_room_waiters)
            outcome: Out | Exception
            try:
                outcome = self.apply(self.connection, [request for request, _ in batch])
            except Exception as exc:
                outcome = exc
            self._loop.call_soon_threadsafe(self._deliver, batch, outcome)

    def _deliver(
        self, batch: list[tuple[Req, asyncio.Future[Any]]], outcome: Out | Exception
    ) -> None:
        if isinstance(outcome, Exception):
            outcome = self._batch_error(outcome)
        self._resolve(batch, outcome)

    async def _finish_batch(self, job: asyncio.Future[Out]) -> Out | Exception:
        limit_s = self._commit_config.op_timeout_s
        try:
            return await wait_within(job, limit_s)
        except TimeoutError as exc:
            error = self.failure(f"writing timed out after {limit_s} s")
            error.__cause__ = exc
            self._note_failure(error)
            return error
        except Exception as exc:
            return self._batch_error(exc)

    def _batch_error(self, exc: Exception) -> Exception:
        """The error a batch's callers get for `exc` raised while applying it."""
        if not isinstance(exc, sqlite3.Error | OSError):
            logger.error("%s: unexpected error writing a batch", self._label, exc_info=exc)
            return self.failure(f"writing failed: {exc!r}")
        error = self.translate(exc, "writing")
        error.__cause__ = exc
        self._note_failure(error)
        return error

    def _note_failure(self, error: Exception) -> None:
        if not self._failing:
            logger.warning("%s: a batch failed: %s", self._label, error)
            self._failing = True
        else:
            logger.debug("%s: a batch failed: %s", self._label, error)

    def _resolve(
        self, batch: list[tuple[Req, asyncio.Future[Any]]], outcome: Out | Exception
    ) -> None:
        requests = [request for request, _ in batch]
        if isinstance(outcome, Exception):
            for _, future in batch:
                if not future.done():
                    future.set_exception(self.copy_error(outcome))
            self.on_batch(requests, None)
            return
        if self._failing:
            logger.warning("%s: writes succeed again", self._label)
            self._failing = False
        for (_, future), result in zip(batch, outcome.results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        self.on_batch(requests, outcome)

    def _fail_items(self, items: list[tuple[Req, asyncio.Future[Any]]]) -> None:
        for _, future in items:
            if not future.done():
                future.set_exception(self.failure(self._refusal))

    def _wake_room_waiters(self) -> None:
        while self._room_waiters:
            room = self._room_waiters.popleft()
            if not room.done():
                room.set_result(None)

    async def _checkpoint(self, mode: str) -> None:
        try:
            await self.call(self.checkpoint, f"{mode} checkpoint", self._conn, mode)
        except Exception as exc:
            logger.warning("%s: %s checkpoint failed: %s", self._label, mode, exc)
