"""Prometheus metrics of one node, kept in a registry of its own so several nodes share a process.

shoal_health_status{component} is 0 healthy, 1 degraded, 2 unhealthy, -1 not applicable.
"""

from __future__ import annotations

import importlib.metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from health.breaker import CircuitBreaker
from health.breaker_config import CircuitState
from health.registry import BreakerRegistry
from health.status import HealthSummary

__all__ = ["NodeMetrics", "package_version"]

SYNC_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
WAL_APPEND_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip


def package_version() -> str:
    """The installed version of shoal, or "unknown" when it is run from a plain checkout."""
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _open_value(state: CircuitState) -> float:
    """1 while the breaker refuses ordinary calls (open, or half-open admitting only probes)."""
    return 0.0 if state is CircuitState.CLOSED else 1.0


class NodeMetrics:
    """Owns one node's CollectorRegistry and every shoal_* metric in it.

    Also a `wal.WalObserver`: pass it to the WriteAheadLog to feed the WAL metrics.
    """

    def __init__(self, node_id: str, version: str | None = None) -> None:
        self.node_id = node_id
        self.registry = CollectorRegistry(auto_describe=True)
        self._bound: list[BreakerRegistry] = []
        self._components: set[str] = set()
        self.sync_duration = Histogram(
            "shoal_sync_duration_seconds",
            "Duration of one sync of one category from one peer.",
            ["category"],
            buckets=SYNC_BUCKETS_S,
            registry=self.registry,
        )
        self.circuit_open = Gauge(
            "shoal_circuit_open",
            "1 while the circuit breaker of a peer and transport is open or half-open, else 0.",
            ["peer", "transport"],
            registry=self.registry,
        )
        self.circuit_transitions = Counter(
            "shoal_circuit_transitions",
            "Circuit breaker state changes, by the state entered.",
            ["peer", "transport", "to"],
            registry=self.registry,
        )
        self.wal_pending = Gauge(
            "shoal_wal_pending_entries",
            "Pending entries of the write-ahead log after the last committed batch.",
            registry=self.registry,
        )
        self.wal_append = Histogram(
            "shoal_wal_append_seconds",
            "Time from a WAL append call to its durable acknowledgement.",
            buckets=WAL_APPEND_BUCKETS_S,
            registry=self.registry,
        )
        self.request_errors = Counter(
            "shoal_p2p_request_errors",
            "Failed requests to a peer (network errors, timeouts, 5xx answers).",
            ["peer"],
            registry=self.registry,
        )
        self.health_status = Gauge(
            "shoal_health_status",
            "Health of a component: 0 healthy, 1 degraded, 2 unhealthy, -1 not applicable.",
            ["component"],
            registry=self.registry,
        )
        self.build_info = Gauge(
            "shoal_build_info",
            "Always 1; the labels say which shoal version runs as which node.",
            ["version", "node_id"],
            registry=self.registry,
        )
        self.build_info.labels(version=version or package_version(), node_id=node_id).set(1)

    def observe_sync(self, category: str, duration_s: float) -> None:
        """Record one finished sync of `category`."""
        self.sync_duration.labels(category=category).observe(duration_s)

    def record_request_error(self, peer: str) -> None:
        """Count one failed request to `peer`."""
        self.request_errors.labels(peer=peer).inc()

    def bind_breakers(self, breakers: BreakerRegistry) -> None:
        """Follow every breaker of `breakers`: transitions are counted, open gauges kept current."""
        if any(bound is breakers for bound in self._bound):
            return
        self._bound.append(breakers)
        breakers.add_listener(self.on_breaker_transition)
        self._refresh_breakers()

    def on_breaker_transition(
        self, breaker: CircuitBreaker, old: CircuitState, new: CircuitState
    ) -> None:
        """A BreakerRegistry listener: counts the transition and sets the open gauge."""
        self.circuit_transitions.labels(
            peer=breaker.peer, transport=breaker.transport, to=new.value
        ).inc()
        self.circuit_open.labels(peer=breaker.peer, transport=breaker.transport).set(
            _open_value(new)
        )

    def record_health(self, summary: HealthSummary) -> None:
        """Set shoal_health_status of every component; drop components that are gone."""
        names = {component.name for component in summary.components}
        for gone in self._components - names:
            self.health_status.remove(gone)
        for component in summary.components:
            self.health_status.labels(component=component.name).set(component.status.severity)
        self._components = names

    def on_append(self, latency_s: float) -> None:
        """WalObserver: one durable append took `latency_s`."""
        self.wal_append.observe(latency_s)

    def on_pending(self, count: int) -> None:
        """WalObserver: the WAL holds `count` pending entries."""
        self.wal_pending.set(count)

    def render(self) -> tuple[bytes, str]:
        """The body and Content-Type of a /metrics answer (Prometheus text format 0.0.4)."""
        self._refresh_breakers()
        return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4

    def _refresh_breakers(self) -> None:
        for breakers in self._bound:
            for snapshot in breakers.all_breakers():
                self.circuit_open.labels(peer=snapshot.peer, transport=snapshot.transport).set(
                    _open_value(snapshot.state)
                )
