"""Rollout streams: producers turn stamped samples into `rollouts` records; the trainer reads
them from every node's store exactly once, in (created_at, sample_id) order, dropping (and
counting) samples more than `max_lag` policy versions old."""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import JsonValue

from config import Timeouts
from node.errors import PeerRequestError, RetryLater, WeightsError
from node.rl.client import call
from node.rl.versions import check_staleness
from node.training.rendezvous import DaemonEndpoint, daemon_endpoint

ROLLOUTS_PATH = "/v1/records/rollouts"
PAGE_LIMIT = 1000
EMPTY_POLL_S = 0.05
SAMPLE_FIELDS = ("model_version", "generated_at", "node")
CONSUMED_PATH = "/v1/rollouts/consumed"

log = logging.getLogger(__name__)


class RolloutRecord(TypedDict):
    """A record of the `rollouts` store (sync.records.schema.ROLLOUTS_SCHEMA) as JSON."""

    sample_id: str
    created_at: float
    model_version: int
    run: str | None
    payload: Any
    """The sample's own JSON, whatever the producer put in it (rollout_record: an object)."""


_ROLLOUT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "sample_id": str,
    "created_at": (int, float),
    "model_version": int,
    "run": (str, type(None)),
}
"""The fields a rollout record is read by, and their JSON types (payload is any JSON)."""


def rollout_from_json(record: object) -> RolloutRecord:
    """A record of a daemon's `rollouts` page, checked field by field (WeightsError naming the
    field otherwise); the record itself is returned, as the daemon sent it."""
    if not isinstance(record, dict):
        raise WeightsError(f"a rollout record is a JSON object, not {type(record).__name__}")
    for name, kinds in _ROLLOUT_FIELDS.items():
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise WeightsError(f"a rollout record's {name} is {value!r}")
    return cast(RolloutRecord, record)


def rollout_record(
    sample: Mapping[str, JsonValue], run: str, sample_id: str | None = None
) -> RolloutRecord:
    """The `rollouts` record of a stamped sample (see versions.stamp_sample): its version and
    time as fields, everything else (with `generated_at`) in `payload`. A daemon's store
    replaces `created_at` by its own time of admission (node.rl.backlog)."""
    version = sample.get("model_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise WeightsError("a rollout needs an integer model_version: stamp it first")
    generated_at = sample.get("generated_at")
    if isinstance(generated_at, bool) or not isinstance(generated_at, int | float):
        raise WeightsError("a rollout needs a numeric generated_at: stamp it first")
    return {
        "sample_id": sample_id or uuid.uuid4().hex,
        "created_at": float(generated_at),
        "model_version": version,
        "run": run,
        "payload": {k: v for k, v in sample.items() if k != "model_version"},
    }


def post_rollouts(
    endpoint: DaemonEndpoint,
    records: Sequence[Mapping[str, object]],
    *,
    stop: threading.Event | None = None,
    sleep: Callable[[float], object] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> int:
    """POST records to the local daemon's rollouts store, blocking while it is full: a 429 (the
    run has rollouts_max_pending unconsumed samples) or a busy 503 is retried after its
    Retry-After (stretched by up to 25% so producers spread out), never dropped. Returns how
    many times it waited. PeerRequestError when refused otherwise; WeightsError when `stop` is
    set while waiting (the records were then not posted)."""
    waits = 0
    while True:
        try:
            call(endpoint, "POST", ROLLOUTS_PATH, list(records))  # type: ignore[arg-type]
        except RetryLater as exc:
            if stop is not None and stop.is_set():
                raise WeightsError(
                    f"stopped while the rollouts store was full: {len(records)} samples not "
                    f"posted ({exc.reason})"
                ) from exc
            waits += 1
            sleep(exc.retry_after_s * (1.0 + 0.25 * rand()))
            continue
        return waits


class RolloutStream:
    """Batches of fresh rollouts of `run` for the trainer, from the daemons at `nodes` (default:
    the local one). Not thread-safe. Memory: one key per consumed or dropped sample (the
    exactly-once check across stores that replicate each other)."""

    def __init__(
        self,
        run: str,
        max_lag: int,
        batch_size: int,
        *,
        nodes: Sequence[str] | None = None,
        daemon_url: str | None = None,
        secret_file: str | Path | None = None,
        timeouts: Timeouts | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise WeightsError(f"max_lag {max_lag!r} must be an integer >= 0 (policy versions)")
        if batch_size < 1:
            raise WeightsError(f"batch_size {batch_size!r} must be at least 1")
        self.run, self.max_lag, self.batch_size = run, max_lag, batch_size
        self.endpoint = daemon_endpoint(daemon_url, secret_file, timeouts=timeouts)
        self.nodes = list(nodes) if nodes else [self.endpoint.url]
        self._cursors: dict[str, tuple[float, str] | None] = dict.fromkeys(self.nodes)
        self._acked: dict[str, tuple[float, str] | None] = dict.fromkeys(self.nodes)
        self._seen: set[str] = set()
        self._buffer: list[RolloutRecord] = []
        self._clock = clock
        self.consumed = 0
        self.dropped_stale = 0
        self.max_lag_seen = 0
        self.registry = registry if registry is not None else CollectorRegistry()
        self._consumed_total = Counter(
            "shoal_rollouts_consumed_total",
            "Rollouts handed to the trainer, by run.",
            ["run"],
            registry=self.registry,
        ).labels(run=run)
        self._dropped_total = Counter(
            "shoal_rollouts_dropped_stale_total",
            "Rollouts dropped because they were more than max_lag versions old, by run.",
            ["run"],
            registry=self.registry,
        ).labels(run=run)
        self._lag = Gauge(
            "shoal_rollouts_max_lag_seen",
            "Largest version lag of a consumed rollout, by run.",
            ["run"],
            registry=self.registry,
        ).labels(run=run)

    def next_batch(self, current_version: int, timeout_s: float = 10.0) -> list[RolloutRecord]:
        """Up to `batch_size` rollouts at most `max_lag` versions behind `current_version`, in
        (created_at, sample_id) order; fewer when `timeout_s` passes first."""
        deadline = self._clock() + timeout_s
        batch: list[RolloutRecord] = []
        while len(batch) < self.batch_size:
            if not self._buffer and not self._fill():
                if self._clock() >= deadline:
                    break
                time.sleep(EMPTY_POLL_S)
                continue
            record = self._buffer.pop(0)
            if not check_staleness(record, current_version, self.max_lag):
                self.dropped_stale += 1
                self._dropped_total.inc()
                continue
            lag = max(0, current_version - record["model_version"])
            self.max_lag_seen = max(self.max_lag_seen, lag)
            self._lag.set(self.max_lag_seen)
            batch.append(record)
        self.consumed += len(batch)
        self._consumed_total.inc(len(batch))
        if not self._buffer:  # everything read is handed out or dropped: tell the nodes now
            for node in self.nodes:
                self._ack(node)
        return batch

    def _fill(self) -> bool:
        """Pull one page from every node; True when something new arrived. Runs only with an
        empty buffer: every record before a node's cursor is consumed, which the node hears
        first (its rollouts store then admits that many more)."""
        fresh: list[RolloutRecord] = []
        for node in self.nodes:
            self._ack(node)
            fresh += self._pull(node)
        fresh.sort(key=lambda r: (float(r["created_at"]), r["sample_id"]))
        self._buffer.extend(fresh)
        return bool(fresh)

    def _ack(self, node: str) -> None:
        cursor = self._cursors[node]
        if cursor is None or cursor == self._acked[node]:
            return
        body = {"run": self.run, "ts": cursor[0], "after": cursor[1]}
        try:
            call(self.endpoint, "POST", CONSUMED_PATH, body, url=node)
        except PeerRequestError as exc:  # told again at the next fill
            log.debug("run %s: %s did not take the consumed position: %s", self.run, node, exc)
            return
        self._acked[node] = cursor

    def _pull(self, node: str) -> list[RolloutRecord]:
        query: dict[str, str | int] = {"run": self.run, "limit": PAGE_LIMIT}
        cursor = self._cursors[node]
        if cursor is not None:
            query.update(ts=repr(cursor[0]), after=cursor[1])
        path = f"{ROLLOUTS_PATH}/since?{urllib.parse.urlencode(query)}"
        try:
            _, page = call(self.endpoint, "GET", path, url=node)
        except PeerRequestError:
            return []
        records = [rollout_from_json(record) for record in page.get("records") or []]
        following = page.get("next")
        if following:
            self._cursors[node] = (float(following["ts"]), str(following["after"]))
        elif records:
            last = records[-1]
            self._cursors[node] = (float(last["created_at"]), last["sample_id"])
        new = []
        for record in records:
            key = record["sample_id"]
            if key not in self._seen:
                self._seen.add(key)
                new.append(record)
        return new
