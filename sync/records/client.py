"""RecordClient: producers hand records to a node in batches, retrying safely until acknowledged.

A retry of a batch the node already committed only adds duplicates (keys are primary keys).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from config import Timeouts, read_error, read_secret_file
from config.closing import AsyncClosing
from net import Identity, PeerClient, PeerRequestError
from net.errors import parse_retry_after
from sync.errors import (
    RecordRejectedError,
    RecordRequestError,
    RecordValidationError,
    StoreClosedError,
)
from sync.records.types import IngestResult
from sync.translate import sync_error

logger = logging.getLogger(__name__)

REJECTED_STATUSES = frozenset({400, 404, 413})
RETRIED_STATUSES = frozenset({502, 503, 504})


def retry_delay_s(
    attempt: int,
    retry_after_s: float | None,
    base_s: float = 0.2,
    cap_s: float = 10.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """Wait before retry number `attempt` (0-based): exponential backoff, never shorter than
    Retry-After, stretched by a random 0-50% so producers that failed together spread out."""
    backoff: float = min(cap_s, base_s * 2.0**attempt)
    return max(backoff, retry_after_s or 0.0) * (1.0 + 0.5 * rand())


def encode_batch(batch: Sequence[Any]) -> bytes:
    """The JSON body of one batch; RecordValidationError if a record is not JSON."""
    try:
        return orjson.dumps(list(batch))
    except (TypeError, ValueError, RecursionError) as exc:
        raise RecordValidationError(None, "", f"records are not JSON: {exc}") from exc


def rejection(status: int, body: bytes) -> RecordRejectedError:
    """A RecordRejectedError from a node's error answer (config.wire's shape) or its raw text."""
    answer = read_error(status, body)
    index = answer.extra.get("index")
    field = answer.extra.get("field")
    return RecordRejectedError(
        answer.reason,
        status,
        index if isinstance(index, int) else None,
        field if isinstance(field, str) else None,
    )


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


class RecordClient(AsyncClosing):
    """Posts records to `node_url` (async context manager; closing is idempotent).

    Signs requests when `secret_file` is given (a ConfigError if it is unreadable). A given
    `peers` (a net.PeerClient) is used as is and left open.
    """

    def __init__(
        self,
        node_url: str,
        secret_file: Path | None = None,
        node_id: str = "cli-producer",
        batch_size: int = 1000,
        timeout_s: float = Timeouts().http_request_s,
        retries: int = 5,
        peers: PeerClient | None = None,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
    ) -> None:
        if batch_size < 1 or retries < 0:
            raise ValueError("batch_size must be >= 1 and retries >= 0")
        self.node_url = node_url.rstrip("/")
        self.batch_size = batch_size
        self.retries = retries
        self._secret_file = secret_file
        self._node_id = node_id
        self._timeout_s = timeout_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._peers = peers
        self._owns_client = peers is None
        self._state = _State.UNOPENED

    async def _enter(self) -> None:
        self.open()

    def open(self) -> None:
        """Create the peer client (when none was given). A closed client cannot be reopened."""
        if self._state is not _State.UNOPENED:
            raise StoreClosedError(f"record client is {self._state.value}")
        if self._peers is None:
            secret = None if self._secret_file is None else read_secret_file(self._secret_file)
            timeouts = Timeouts(http_request_s=self._timeout_s)
            self._peers = PeerClient(Identity(secret, self._node_id), timeouts=timeouts)
        self._state = _State.OPENED

    async def close(self) -> None:
        """Close the peer client this client made. Idempotent."""
        self._state = _State.CLOSED
        peers, self._peers = self._peers, None
        if peers is not None and self._owns_client:
            await peers.close()

    async def record(self, store: str, records: Iterable[Any]) -> IngestResult:
        """Send `records` in batches of batch_size; the sum over batches once all are durable.

        Raises RecordRejectedError (never retried) for a batch the node refuses, and
        RecordRequestError when retries run out; batches before it stay committed.
        """
        total = IngestResult()
        batch: list[Any] = []
        for record in records:
            batch.append(record)
            if len(batch) >= self.batch_size:
                total += await self.send_batch(store, batch)
                batch = []
        if batch:
            total += await self.send_batch(store, batch)
        return total

    async def send_batch(self, store: str, batch: Sequence[Any]) -> IngestResult:
        """Post one batch (one request) and retry on connection errors, timeouts and 502-504."""
        if self._state is not _State.OPENED or self._peers is None:
            raise StoreClosedError(f"record client is {self._state.value}")
        if not batch:
            return IngestResult()
        body = encode_batch(batch)
        path = f"/v1/records/{quote(store, safe='')}"
        url = f"{self.node_url}{path}"
        headers = {"Content-Type": "application/json"}
        for attempt in range(self.retries + 1):
            retry_after: float | None = None
            status: int | None = None
            try:
                response = await self._peers.request(
                    "POST", self.node_url, path, data=body, headers=headers, check=False
                )
            except PeerRequestError as exc:  # no answer: retried; else a broken answer: not
                if exc.status is not None:
                    raise sync_error(exc, url, RecordRequestError) from exc
                problem = f"{type(exc).__name__}: {exc.reason}"
                if attempt == self.retries:
                    raise sync_error(
                        exc, f"{url}: gave up after {attempt + 1} attempts", RecordRequestError
                    ) from exc
            else:
                payload = response.body
                if response.status == 200:
                    return _ingest_result(url, payload)
                if response.status in REJECTED_STATUSES:
                    raise rejection(response.status, payload)
                if response.status not in RETRIED_STATUSES:
                    raise RecordRequestError(
                        f"{url}: HTTP {response.status}: {rejection(response.status, payload)}",
                        response.status,
                    )
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                status = response.status
                problem = f"HTTP {status}: {rejection(status, payload).reason}"
            if attempt == self.retries:
                raise RecordRequestError(
                    f"{url}: gave up after {attempt + 1} attempts: {problem}", status
                )
            delay = retry_delay_s(attempt, retry_after, self._backoff_s, self._max_backoff_s)
            logger.debug("%s: %s; retry %s in %.2f s", url, problem, attempt + 1, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


def _ingest_result(url: str, payload: bytes) -> IngestResult:
    try:
        data = orjson.loads(payload)
        return IngestResult(int(data["accepted"]), int(data["duplicates"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise RecordRequestError(f"{url}: unexpected answer {payload[:200]!r}", 200) from exc
