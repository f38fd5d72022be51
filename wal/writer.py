"""The WAL's writer: group commit (group_commit.py) of WAL requests, each batch applied in a single
synchronous=FULL transaction (batch.py), with the durable counters kept in step.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path

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
from wal.group_commit import GroupCommit, GroupCommitConfig
from wal.schema import COUNTER_NAMES, open_write_connection, read_counters

logger = logging.getLogger(__name__)


class BatchWriter(GroupCommit[Request, BatchOutcome]):
    """Owns the WAL's write connection; appends, transitions, state and cleanup go through it.

    `pending_count` and `last_id` follow the durable counters after each batch;
    `appends_in_flight` counts appends queued or being written.
    """

    def __init__(self, path: Path, config: WalConfig, observer: WalObserver | None) -> None:
        super().__init__(
            f"WAL {path}",
            GroupCommitConfig(
                max_batch=config.max_batch,
                max_batch_delay_ms=config.max_batch_delay_ms,
                queue_limit=config.queue_limit,
                op_timeout_s=config.op_timeout_s,
                open_timeout_s=config.open_timeout_s,
                idle_checkpoint_s=config.idle_checkpoint_s,
                checkpoint_interval_s=config.checkpoint_interval_s,
            ),
            closed_reason="write-ahead log is closed",
            thread_name="wal-writer",
        )
        self._path = path
        self._config = config
        self._observer = observer
        self.pending_count = 0
        self.appends_in_flight = 0
        self.last_id = 0

    async def open(self) -> None:
        """Open and validate the file, read its counters and start the batching task."""
        await self.open_connection(open_write_connection, self._path, self._config)
        counters = await self.call(read_counters, "reading counters", self.connection)
        missing = set(COUNTER_NAMES) - counters.keys()
        if missing:
            raise WalError(f"{self._path}: WAL counters {sorted(missing)} are missing")
        self.pending_count = pending_from(counters)
        self.last_id = counters["last_id"]
        self.start()

    def enqueue_append(self, request: AppendRequest) -> asyncio.Future[Result]:
        """Queue an append; the future resolves with its id once its batch committed."""
        future: asyncio.Future[Result] = self.enqueue(request)
        self.appends_in_flight += 1
        return future

    async def submit(self, request: Request) -> Result:
        """Queue `request`, waiting for room first, and wait until its batch committed."""
        result: Result = await super().submit(request)
        return result

    def apply(self, conn: sqlite3.Connection, requests: list[Request]) -> BatchOutcome:
        return apply_batch(conn, requests, self._config.max_retries, time.time())

    def checkpoint(self, conn: sqlite3.Connection, mode: str) -> None:
        busy, frames, copied = checkpoint(conn, mode, self._config.busy_timeout_s)
        logger.debug(
            "WAL %s: %s checkpoint busy=%s frames=%s copied=%s",
            self._path,
            mode,
            busy,
            frames,
            copied,
        )

    def translate(self, exc: sqlite3.Error | OSError, doing: str) -> Exception:
        return translate(exc, self._path, doing)

    def failure(self, reason: str) -> Exception:
        return WalError(f"{self._path}: {reason}")

    def copy_error(self, error: Exception) -> Exception:
        return WalError(str(error))

    def on_batch(self, requests: list[Request], outcome: BatchOutcome | None) -> None:
        self.appends_in_flight -= sum(1 for r in requests if r.__class__ is AppendRequest)
        if outcome is None:
            return
        self.pending_count = pending_from(outcome.counters)
        self.last_id = outcome.counters["last_id"]
        if self._observer is not None:
            try:
                self._observer.on_pending(self.pending_count)
            except Exception:
                logger.exception("WAL %s: observer.on_pending failed", self._path)
