"""Breaker registry: a breaker per peer and transport, snapshots, config, own-network alarm."""

from __future__ import annotations

import logging

import pytest

from health import (
    BreakerConfig,
    BreakerRegistry,
    CircuitBreaker,
    CircuitState,
    all_breakers,
    breaker_for,
    configure_breakers,
    default_registry,
    format_breakers,
    reset_all_breakers,
)
from tests.health.conftest import FakeClock

CONFIG = BreakerConfig(failure_threshold=2, recovery_timeout_s=10.0, max_backoff_s=40.0)


async def trip(breaker: CircuitBreaker) -> None:
    for _ in range(breaker.config.failure_threshold):
        with pytest.raises(ConnectionError):
            async with breaker:
                raise ConnectionError("down")
    assert breaker.state is CircuitState.OPEN


def alarms(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and "own network" in r.msg]


def test_one_breaker_per_peer_and_transport(clock: FakeClock) -> None:
    registry = BreakerRegistry(CONFIG, clock=clock)
    http = registry.breaker_for("gpu-a")
    assert registry.breaker_for("gpu-a", transport="http") is http
    rsync = registry.breaker_for("gpu-a", transport="rsync")
    assert rsync is not http
    assert (http.peer, http.transport, http.name) == ("gpu-a", "http", "gpu-a/http")
    assert registry.breaker_for("gpu-b") is not http
    assert [b.name for b in registry.breakers()] == ["gpu-a/http", "gpu-a/rsync", "gpu-b/http"]


async def test_snapshots_reset_and_configure(clock: FakeClock) -> None:
    registry = BreakerRegistry(CONFIG, clock=clock)
    await trip(registry.breaker_for("gpu-b"))
    registry.breaker_for("gpu-a")
    snaps = registry.all_breakers()
    assert [(s.peer, s.state) for s in snaps] == [
        ("gpu-a", CircuitState.CLOSED),
        ("gpu-b", CircuitState.OPEN),
    ]
    assert snaps[1].retry_after_s == 10.0
    assert snaps[1].total_failures == 2
    assert "1 of 2 not closed" in format_breakers(snaps)
    assert "gpu-b over http: open" in format_breakers(snaps)

    bigger = BreakerConfig(failure_threshold=7, recovery_timeout_s=20.0, max_backoff_s=80.0)
    registry.configure_breakers(bigger)
    assert registry.breaker_for("gpu-a").config is bigger
    assert registry.breaker_for("gpu-c").config is bigger
    assert registry.all_breakers()[1].current_recovery_s == 20.0

    registry.reset_all_breakers()
    assert all(s.state is CircuitState.CLOSED for s in registry.all_breakers())


async def test_registries_are_independent(clock: FakeClock) -> None:
    first = BreakerRegistry(CONFIG, clock=clock, node_id="n1")
    second = BreakerRegistry(CONFIG, clock=clock, node_id="n2")
    await trip(first.breaker_for("gpu-a"))
    assert second.breaker_for("gpu-a") is not first.breaker_for("gpu-a")
    assert second.breaker_for("gpu-a").state is CircuitState.CLOSED


async def test_default_registry_functions() -> None:
    peer = "default-registry-test-peer"
    breaker = breaker_for(peer, transport="rsync")
    try:
        assert breaker_for(peer, "rsync") is breaker
        assert default_registry().breaker_for(peer, "rsync") is breaker
        configure_breakers(CONFIG)
        assert breaker.config is CONFIG
        await trip(breaker)
        assert any(s.name == breaker.name and s.state is CircuitState.OPEN for s in all_breakers())
        reset_all_breakers()
        assert breaker.state is CircuitState.CLOSED
    finally:
        default_registry().forget(peer)
        configure_breakers(BreakerConfig())


async def test_registry_listeners_get_the_breaker(clock: FakeClock) -> None:
    registry = BreakerRegistry(CONFIG, clock=clock)
    seen: list[tuple[str, str, CircuitState]] = []
    registry.add_listener(lambda b, old, new: seen.append((b.peer, b.transport, new)))
    await trip(registry.breaker_for("gpu-a", "rsync"))
    assert seen == [("gpu-a", "rsync", CircuitState.OPEN)]


async def test_own_network_alarm_logs_once_and_again_after_recovery(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="health.registry")
    registry = BreakerRegistry(CONFIG, clock=clock, node_id="gpu-z")
    peers = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    for peer in peers:
        registry.breaker_for(peer)
    registry.breaker_for("gpu-a", "rsync")
    await trip(registry.breaker_for("gpu-a"))
    await trip(registry.breaker_for("gpu-a", "rsync"))
    await trip(registry.breaker_for("gpu-b"))
    assert not alarms(caplog)  # 2 of 4 peers: not more than half
    assert not registry.own_network_suspected
    await trip(registry.breaker_for("gpu-c"))
    assert registry.own_network_suspected
    [alarm] = alarms(caplog)
    assert "gpu-z" in alarm.getMessage()
    assert "3 of 4 peers" in alarm.getMessage()
    await trip(registry.breaker_for("gpu-d"))
    clock.advance(10.0)
    assert registry.breaker_for("gpu-d").state is CircuitState.HALF_OPEN
    assert len(alarms(caplog)) == 1  # still the same episode

    registry.reset_all_breakers()
    assert not registry.own_network_suspected
    assert any("looks healthy again" in r.getMessage() for r in caplog.records)
    for peer in peers[:3]:
        await trip(registry.breaker_for(peer))
    assert len(alarms(caplog)) == 2


async def test_own_network_alarm_needs_two_peers(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    registry = BreakerRegistry(CONFIG, clock=clock)
    await trip(registry.breaker_for("gpu-a"))
    await trip(registry.breaker_for("gpu-a", "rsync"))
    assert not registry.own_network_suspected
    assert not alarms(caplog)
    await trip(registry.breaker_for("gpu-b"))
    assert registry.own_network_suspected
    registry.forget("gpu-b")
    assert not registry.own_network_suspected
