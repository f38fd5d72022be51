"""NodeMetrics: exposition parsed back, breaker and health binding, two nodes in one process."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from health import (
    BreakerConfig,
    BreakerRegistry,
    CircuitBreaker,
    CircuitState,
    ComponentHealth,
    HealthStatus,
    NodeMetrics,
    summarize,
)
from tests.health.conftest import FakeClock


def samples(metrics: NodeMetrics) -> dict[str, list[Sample]]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    by_name: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append(sample)
    return by_name


def value(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    for sample in samples(metrics).get(name, []):
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    return None


async def trip(breaker: CircuitBreaker) -> None:
    for _ in range(breaker.config.failure_threshold):
        with pytest.raises(ConnectionError):
            async with breaker:
                raise ConnectionError("down")


def component(name: str, status: HealthStatus) -> ComponentHealth:
    return ComponentHealth(name, status, "", 0.0, {})


def test_metric_names_and_build_info() -> None:
    metrics = NodeMetrics("gpu-a", version="1.2.3")
    metrics.observe_sync("checkpoints", 3.2)
    metrics.record_request_error("gpu-b")
    metrics.record_request_error("gpu-b")
    found = samples(metrics)
    assert value(metrics, "shoal_build_info", version="1.2.3", node_id="gpu-a") == 1.0
    assert value(metrics, "shoal_sync_duration_seconds_count", category="checkpoints") == 1.0
    assert value(metrics, "shoal_sync_duration_seconds_sum", category="checkpoints") == 3.2
    assert value(metrics, "shoal_sync_duration_seconds_bucket", category="checkpoints", le="5.0")
    assert value(metrics, "shoal_p2p_request_errors_total", peer="gpu-b") == 2.0
    assert {"shoal_wal_pending_entries", "shoal_wal_append_seconds_count"} <= set(found)


def test_wal_observer() -> None:
    metrics = NodeMetrics("gpu-a")
    metrics.on_append(0.004)
    metrics.on_append(0.002)
    metrics.on_pending(17)
    assert value(metrics, "shoal_wal_pending_entries") == 17.0
    assert value(metrics, "shoal_wal_append_seconds_count") == 2.0
    assert value(metrics, "shoal_wal_append_seconds_bucket", le="0.0025") == 1.0


async def test_breaker_gauges_and_transitions(clock: FakeClock) -> None:
    registry = BreakerRegistry(
        BreakerConfig(failure_threshold=1, recovery_timeout_s=5.0), clock=clock
    )
    registry.breaker_for("gpu-b")
    metrics = NodeMetrics("gpu-a")
    metrics.bind_breakers(registry)
    metrics.bind_breakers(registry)  # binding twice counts once
    assert value(metrics, "shoal_circuit_open", peer="gpu-b", transport="http") == 0.0
    await trip(registry.breaker_for("gpu-c", "rsync"))
    assert value(metrics, "shoal_circuit_open", peer="gpu-c", transport="rsync") == 1.0
    assert (
        value(
            metrics, "shoal_circuit_transitions_total", peer="gpu-c", transport="rsync", to="open"
        )
        == 1.0
    )
    clock.advance(5.0)
    assert registry.breaker_for("gpu-c", "rsync").state is CircuitState.HALF_OPEN
    assert value(metrics, "shoal_circuit_open", peer="gpu-c", transport="rsync") == 1.0
    registry.reset_all_breakers()
    assert value(metrics, "shoal_circuit_open", peer="gpu-c", transport="rsync") == 0.0
    transitions = {
        s.labels["to"]: s.value
        for s in samples(metrics)["shoal_circuit_transitions_total"]
        if s.labels["peer"] == "gpu-c"
    }
    assert transitions == {"open": 1.0, "half_open": 1.0, "closed": 1.0}


def test_health_status_gauge() -> None:
    metrics = NodeMetrics("gpu-a")
    metrics.record_health(
        summarize(
            (
                component("disk", HealthStatus.HEALTHY),
                component("wal", HealthStatus.DEGRADED),
                component("backlog", HealthStatus.UNHEALTHY),
                component("gpu", HealthStatus.NOT_APPLICABLE),
            )
        )
    )
    got = {s.labels["component"]: s.value for s in samples(metrics)["shoal_health_status"]}
    assert got == {"disk": 0.0, "wal": 1.0, "backlog": 2.0, "gpu": -1.0}
    metrics.record_health(summarize((component("disk", HealthStatus.UNHEALTHY),)))
    got = {s.labels["component"]: s.value for s in samples(metrics)["shoal_health_status"]}
    assert got == {"disk": 2.0}


def test_two_nodes_in_one_process_do_not_collide() -> None:
    first = NodeMetrics("gpu-a", version="1")
    second = NodeMetrics("gpu-b", version="1")
    first.record_request_error("gpu-c")
    second.on_pending(3)
    assert value(first, "shoal_p2p_request_errors_total", peer="gpu-c") == 1.0
    assert value(second, "shoal_p2p_request_errors_total", peer="gpu-c") is None
    assert value(first, "shoal_wal_pending_entries") == 0.0
    assert value(second, "shoal_wal_pending_entries") == 3.0
    assert value(second, "shoal_build_info", node_id="gpu-b") == 1.0
    assert value(second, "shoal_build_info", node_id="gpu-a") is None
