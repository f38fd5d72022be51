"""Cluster metrics of one node for Prometheus: read from the runtime at scrape time, plus HTTP.

Members by state, term, coordinator and plan version, per-GPU readings and every HTTP request by
route pattern and status. Labels stay low-cardinality: route patterns, never paths or ids.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from node.runtime import NodeRuntime

__all__ = [
    "FAILURE_REASONS",
    "HTTP_BUCKETS_S",
    "FanoutCollector",
    "HttpMetrics",
    "RuntimeCollector",
    "ServedMetrics",
    "SyncMetrics",
    "failure_reason",
    "served_metrics",
]

MEMBER_STATES = ("alive", "suspect", "dead", "left")
HTTP_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
UNMATCHED_ROUTE = "unmatched"
MIB = 1024 * 1024


class RuntimeCollector(Collector):
    """Reads the node's live state on every scrape, so the series are never stale."""

    def __init__(self, runtime: NodeRuntime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self._runtime
        runtime.refresh()
        yield from self._membership(runtime)
        yield from self._election(runtime)
        yield from self._gpus(runtime.gpus())

    @staticmethod
    def _membership(runtime: NodeRuntime) -> Iterator[Metric]:
        members = GaugeMetricFamily(
            "shoal_members", "Members of this node's membership view by state", labels=["state"]
        )
        counts = dict(runtime.membership.counts()) if runtime.membership is not None else {}
        for state in MEMBER_STATES:
            members.add_metric([state], float(counts.get(state, 0)))
        yield members
        dropped = CounterMetricFamily(
            "shoal_membership_datagrams_dropped",
            "Membership datagrams refused by reason (unknown_key: sealed with a gossip key this "
            "node lacks; bad_mac: failed authentication; refused_sender: from a member this node "
            "refuses, its certificate revoked; stale, replayed, cluster, ...)",
            labels=["reason"],
        )
        stats = getattr(runtime.membership, "transport_stats", None)
        for reason, count in sorted((stats().dropped if callable(stats) else {}).items()):
            dropped.add_metric([reason], float(count))
        refused = getattr(runtime.membership, "refused_datagrams", 0)
        if refused:  # from members this node refuses (node.identity.revoked)
            dropped.add_metric(["refused_sender"], float(refused))
        yield dropped
        events = CounterMetricFamily(
            "shoal_membership_events",
            "Changes of this node's membership view by kind (suspect: a probe failed; dead: a "
            "suspicion ran out; alive: a suspect or dead member refuted)",
            labels=["kind"],
        )
        counted = getattr(runtime.membership, "event_counts", None)
        for kind, count in sorted((counted() if callable(counted) else {}).items()):
            events.add_metric([kind], float(count))
        yield events

    @staticmethod
    def _election(runtime: NodeRuntime) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "shoal_election_term",
            "The highest election term this node knows (0 before any)",
            value=float(runtime.term or 0),
        )
        yield GaugeMetricFamily(
            "shoal_coordinator",
            "1 while this node is the coordinator of its term",
            value=1.0 if runtime.coordinator == runtime.node_id else 0.0,
        )
        yield GaugeMetricFamily(
            "shoal_coordinator_known",
            "1 while this node knows a coordinator with a valid lease",
            value=1.0 if runtime.coordinator else 0.0,
        )
        yield GaugeMetricFamily(
            "shoal_plan_version",
            "Version of the role plan this node applies (0 before any)",
            value=float(runtime.plan_version or 0),
        )

    @staticmethod
    def _gpus(readings: list[dict[str, Any]]) -> Iterator[Metric]:
        gauges = {
            "util_pct": GaugeMetricFamily(
                "shoal_gpu_utilization_ratio", "GPU utilization (0-1), NVML", labels=["gpu"]
            ),
            "memory_used_mb": GaugeMetricFamily(
                "shoal_gpu_memory_used_bytes", "GPU memory in use, NVML", labels=["gpu"]
            ),
            "memory_total_mb": GaugeMetricFamily(
                "shoal_gpu_memory_total_bytes", "GPU memory in total, NVML", labels=["gpu"]
            ),
            "temperature_c": GaugeMetricFamily(
                "shoal_gpu_temperature_celsius", "GPU temperature, NVML", labels=["gpu"]
            ),
            "power_watts": GaugeMetricFamily(
                "shoal_gpu_power_watts", "GPU power draw, NVML", labels=["gpu"]
            ),
        }
        counters = {
            "ecc_uncorrected": CounterMetricFamily(
                "shoal_gpu_ecc_uncorrected_errors",
                "Uncorrected ECC errors since the driver loaded, NVML",
                labels=["gpu"],
            ),
            "xid_errors": CounterMetricFamily(
                "shoal_gpu_xid_errors", "XID errors seen by this node, NVML", labels=["gpu"]
            ),
        }
        scale = {"util_pct": 0.01, "memory_used_mb": MIB, "memory_total_mb": MIB}
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {**gauges, **counters}
        for reading in readings:
            gpu = str(reading.get("index", "?"))
            for key, family in families.items():
                value = reading.get(key)
                if isinstance(value, int | float):
                    family.add_metric([gpu], float(value) * scale.get(key, 1.0))
        yield from gauges.values()
        yield from counters.values()


class FanoutCollector(Collector):
    """Fan-out tallies of the node's sync, read at scrape time: file bytes served to peers per
    category (on the node a file came from first, its egress), and piece bytes received by
    swarm downloads from peers and from origins."""

    def __init__(
        self, tallies: Callable[[], dict[str, dict[str, int]]], categories: tuple[str, ...]
    ) -> None:
        self._tallies = tallies
        self._categories = categories

    def collect(self) -> Iterator[Metric]:
        tallies = self._tallies()
        served = CounterMetricFamily(
            "shoal_sync_bytes_served",
            "File bytes this node served to peers (file, batch and piece routes), by category",
            labels=["category"],
        )
        received = CounterMetricFamily(
            "shoal_sync_piece_bytes_received",
            "Piece bytes swarm downloads received, by category and source (peer or origin)",
            labels=["category", "source"],
        )
        for category in sorted({*self._categories, *tallies}):
            counts = tallies.get(category, {})
            served.add_metric([category], float(counts.get("served_bytes", 0)))
            received.add_metric([category, "peer"], float(counts.get("from_peers_bytes", 0)))
            received.add_metric([category, "origin"], float(counts.get("from_origin_bytes", 0)))
        yield served
        yield received


class HttpMetrics:
    """Requests served by route pattern, method and status, with a duration histogram."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "shoal_http_requests",
            "HTTP requests served, by route pattern, method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "shoal_http_request_duration_seconds",
            "Time to answer an HTTP request, by route pattern and method",
            ["route", "method"],
            buckets=HTTP_BUCKETS_S,
            registry=registry,
        )

    def observe(self, route: str, method: str, status: int, duration_s: float) -> None:
        self.requests.labels(route=route, method=method, status=str(status)).inc()
        self.duration.labels(route=route, method=method).observe(duration_s)

    def middleware(self) -> Any:
        """An aiohttp middleware (outermost) that observes every answer, refusals included."""

        @web.middleware
        async def observe_request(request: web.Request, handler: Any) -> web.StreamResponse:
            started = time.monotonic()
            status = 500
            try:
                response: web.StreamResponse = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                self.observe(_route_of(request), request.method, status, time.monotonic() - started)

        return observe_request


def _route_of(request: web.Request) -> str:
    """The route pattern (`/v1/records/{store}`), never the path: labels stay few."""
    resource = request.match_info.route.resource
    if resource is None:
        return UNMATCHED_ROUTE
    return resource.canonical


FAILURE_REASONS = (
    "timeout",
    "circuit_open",
    "changed",
    "no_space",
    "refused",
    "unreachable",
    "other",
)
_REASON_PATTERNS = (
    ("timeout", re.compile(r"timed? ?out|timeout", re.IGNORECASE)),
    ("circuit_open", re.compile(r"circuit|breaker", re.IGNORECASE)),
    ("changed", re.compile(r"changed|no longer has|hash mismatch|412", re.IGNORECASE)),
    ("no_space", re.compile(r"space|disk full|507", re.IGNORECASE)),
    ("refused", re.compile(r"HTTP 4\d\d|401|403|refused", re.IGNORECASE)),
    ("unreachable", re.compile(r"connect|unreachable|reset|HTTP 5\d\d", re.IGNORECASE)),
)


def failure_reason(error: str) -> str:
    """The low-cardinality reason label of a transfer failure's text (one of FAILURE_REASONS)."""
    for reason, pattern in _REASON_PATTERNS:
        if pattern.search(error):
            return reason
    return "other"


class SyncMetrics:
    """Records ingested, duplicates and pulled per store; file bytes and files per category and
    peer; transfer failures per category and reason. Counted where the work happens."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.records_ingested = Counter(
            "shoal_records_ingested",
            "Records accepted by POST /v1/records/{store} (new ones)",
            ["store"],
            registry=registry,
        )
        self.records_duplicates = Counter(
            "shoal_records_duplicates",
            "Records received (ingested or pulled) that the store already held",
            ["store"],
            registry=registry,
        )
        self.records_pulled = Counter(
            "shoal_records_pulled",
            "Records pulled from peers by sync (new ones)",
            ["store", "peer"],
            registry=registry,
        )
        self.sync_bytes = Counter(
            "shoal_sync_bytes",
            "File bytes installed by sync",
            ["category", "peer"],
            registry=registry,
        )
        self.sync_files = Counter(
            "shoal_sync_files",
            "Files installed by sync",
            ["category", "peer"],
            registry=registry,
        )
        self.sync_failures = Counter(
            "shoal_sync_transfer_failures",
            "Sync transfers that failed, by category and reason",
            ["category", "reason"],
            registry=registry,
        )

    def ingested(self, store: str, accepted: int, duplicates: int) -> None:
        self.records_ingested.labels(store=store).inc(accepted)
        self.records_duplicates.labels(store=store).inc(duplicates)

    def pulled(self, store: str, peer: str, inserted: int, duplicates: int) -> None:
        self.records_pulled.labels(store=store, peer=peer).inc(inserted)
        self.records_duplicates.labels(store=store).inc(duplicates)

    def installed(self, category: str, peer: str, files: int, size_bytes: int) -> None:
        self.sync_files.labels(category=category, peer=peer).inc(files)
        self.sync_bytes.labels(category=category, peer=peer).inc(size_bytes)

    def failed(self, category: str, error: str) -> None:
        self.sync_failures.labels(category=category, reason=failure_reason(error)).inc()


@dataclass(frozen=True)
class ServedMetrics:
    """The series a node's served parts observe, made once per node in its registry: every HTTP
    request (the app's middleware), records ingested and pulled, files synced (the record
    stores and the sync service)."""

    http: HttpMetrics
    sync: SyncMetrics

    def ingest_counter(self) -> Callable[[str, int, int], None]:
        """record_routes' on_ingest: counts ingested records and duplicates per store."""
        return self.sync.ingested


class JobsCollector(Collector):
    """This node's jobs by state (`shoal_jobs`), read from `counts` on every scrape."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "shoal_jobs", "This node's jobs by state (the job API)", labels=["state"]
        )
        for state, count in self._counts().items():
            jobs.add_metric([state], float(count))
        yield jobs


def served_metrics(runtime: NodeRuntime) -> ServedMetrics | None:
    """Register the runtime collector and the HTTP and sync series in the node's registry (call
    once per node: a second call finds the names taken); None for a runtime without metrics."""
    if runtime.metrics is None:
        return None
    registry = runtime.metrics.registry
    registry.register(RuntimeCollector(runtime))
    return ServedMetrics(HttpMetrics(registry), SyncMetrics(registry))
