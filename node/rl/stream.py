"""Rollout streams: producers turn stamped samples into `rollouts` records; the trainer reads
them from every node's store exactly once, in (created_at, sample_id) order, dropping (and
counting) samples more than `max_lag` policy versions old."""

from __future__ import annotations

import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from config import Timeouts
from node.errors import PeerRequestError, WeightsError
from node.rl.client import call
from node.rl.versions import check_staleness
from node.training.rendezvous import DaemonEndpoint, daemon_endpoint

ROLLOUTS_PATH = "/v1/records/rollouts"
PAGE_LIMIT = 1000
EMPTY_POLL_S = 0.05
SAMPLE_FIELDS = ("model_version", "generated_at", "node")


def rollout_record(
    sample: Mapping[str, Any], run: str, sample_id: str | None = None
) -> dict[str, Any]:
    """The `rollouts` record of a stamped sample (see versions.stamp_sample): its version and
    time as fields, everything else in `payload`."""
    version = sample.get("model_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise WeightsError("a rollout needs an integer model_version: stamp it first")
    return {
        "sample_id": sample_id or uuid.uuid4().hex,
        "created_at": float(sample["generated_at"]),
        "model_version": version,
        "run": run,
        "payload": {k: v for k, v in sample.items() if k not in ("model_version", "generated_at")},
    }


def post_rollouts(endpoint: DaemonEndpoint, records: Sequence[Mapping[str, Any]]) -> None:
    """POST records to the local daemon's rollouts store (PeerRequestError when refused)."""
    call(endpoint, "POST", ROLLOUTS_PATH, list(records))  # type: ignore[arg-type]


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
        self._seen: set[str] = set()
        self._buffer: list[dict[str, Any]] = []
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

    def next_batch(self, current_version: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Up to `batch_size` rollouts at most `max_lag` versions behind `current_version`, in
        (created_at, sample_id) order; fewer when `timeout_s` passes first."""
        deadline = self._clock() + timeout_s
        batch: list[dict[str, Any]] = []
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
            lag = max(0, current_version - int(record["model_version"]))
            self.max_lag_seen = max(self.max_lag_seen, lag)
            self._lag.set(self.max_lag_seen)
            batch.append(record)
        self.consumed += len(batch)
        self._consumed_total.inc(len(batch))
        return batch

    def _fill(self) -> bool:
        """Pull one page from every node; True when something new arrived."""
        fresh: list[dict[str, Any]] = []
        for node in self.nodes:
            fresh += self._pull(node)
        fresh.sort(key=lambda r: (float(r["created_at"]), str(r["sample_id"])))
        self._buffer.extend(fresh)
        return bool(fresh)

    def _pull(self, node: str) -> list[dict[str, Any]]:
        query: dict[str, Any] = {"run": self.run, "limit": PAGE_LIMIT}
        cursor = self._cursors[node]
        if cursor is not None:
            query.update(ts=repr(cursor[0]), after=cursor[1])
        path = f"{ROLLOUTS_PATH}/since?{urllib.parse.urlencode(query)}"
        try:
            _, page = call(self.endpoint, "GET", path, url=node)
        except PeerRequestError:
            return []
        records = page.get("records") or []
        following = page.get("next")
        if following:
            self._cursors[node] = (float(following["ts"]), str(following["after"]))
        elif records:
            last = records[-1]
            self._cursors[node] = (float(last["created_at"]), str(last["sample_id"]))
        new = []
        for record in records:
            key = str(record["sample_id"])
            if key not in self._seen:
                self._seen.add(key)
                new.append(record)
        return new
