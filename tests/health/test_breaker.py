"""Circuit breaker transitions on a fake clock: threshold, exclusions, recovery, probes, backoff."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from typing import Any

import pytest

from health import (
    BreakerConfig,
    CircuitBreaker,
    CircuitOpenError,
    CircuitState,
    HealthConfigError,
    HealthError,
)
from tests.health.conftest import FakeClock


class PeerSaidNo(Exception):
    """Stands for an auth error: the peer answered, so it is alive."""


class HttpStatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


async def call(breaker: CircuitBreaker, exc: BaseException | None = None) -> str:
    async with breaker:
        if exc is not None:
            raise exc
    return "ok"


async def fail(breaker: CircuitBreaker, times: int = 1) -> None:
    for _ in range(times):
        with pytest.raises(ConnectionError):
            await call(breaker, ConnectionError("peer down"))


BASE = BreakerConfig(
    failure_threshold=3,
    recovery_timeout_s=10.0,
    half_open_requests=1,
    max_backoff_s=80.0,
    decay_after_s=100.0,
    probe_timeout_s=5.0,
)


def make(clock: FakeClock, **overrides: Any) -> CircuitBreaker:
    return CircuitBreaker("sync-gpu-a", dataclasses.replace(BASE, **overrides), clock=clock)


async def trip(breaker: CircuitBreaker) -> None:
    await fail(breaker, breaker.config.failure_threshold)
    assert breaker.state is CircuitState.OPEN


async def test_opens_after_threshold_consecutive_failures(clock: FakeClock) -> None:
    breaker = make(clock)
    await fail(breaker, 2)
    assert breaker.state is CircuitState.CLOSED
    assert await call(breaker) == "ok"  # a success resets the count
    await fail(breaker, 2)
    assert breaker.state is CircuitState.CLOSED
    assert breaker.snapshot().consecutive_failures == 2
    await fail(breaker)
    assert breaker.state is CircuitState.OPEN


async def test_open_refuses_with_retry_after_until_recovery(clock: FakeClock) -> None:
    breaker = make(clock)
    await trip(breaker)
    clock.advance(4.0)
    with pytest.raises(CircuitOpenError) as info:
        await call(breaker)
    assert info.value.name == "sync-gpu-a"
    assert info.value.retry_after_s == pytest.approx(6.0)
    assert "retry in 6.0 s" in str(info.value)
    assert isinstance(info.value, HealthError)
    clock.advance(5.9)
    assert breaker.state is CircuitState.OPEN
    clock.advance(0.1)
    assert breaker.state is CircuitState.HALF_OPEN
    assert await call(breaker) == "ok"
    assert breaker.state is CircuitState.CLOSED


async def test_excluded_exceptions_and_predicate_do_not_count(clock: FakeClock) -> None:
    breaker = make(
        clock,
        excluded=(PeerSaidNo,),
        is_failure=lambda exc: not (isinstance(exc, HttpStatusError) and exc.status < 500),
    )
    for _ in range(10):
        with pytest.raises(PeerSaidNo):
            await call(breaker, PeerSaidNo("401"))
        with pytest.raises(HttpStatusError):
            await call(breaker, HttpStatusError(404))
    assert breaker.state is CircuitState.CLOSED
    await fail(breaker, 2)
    with pytest.raises(HttpStatusError):
        await call(breaker, HttpStatusError(403))  # the peer answered: resets the count
    await fail(breaker, 2)
    assert breaker.state is CircuitState.CLOSED
    with pytest.raises(HttpStatusError):
        await call(breaker, HttpStatusError(503))  # a 5xx is the peer failing: the third
    assert breaker.state is CircuitState.OPEN


async def test_cancellation_never_counts(clock: FakeClock) -> None:
    breaker = make(clock, failure_threshold=1)
    for _ in range(5):
        with pytest.raises(asyncio.CancelledError):
            await call(breaker, asyncio.CancelledError())
    assert breaker.state is CircuitState.CLOSED
    assert breaker.snapshot().total_failures == 0


async def test_half_open_admits_exactly_the_probe_count(clock: FakeClock) -> None:
    breaker = make(clock, half_open_requests=3)
    await trip(breaker)
    clock.advance(10.0)
    gate = asyncio.Event()
    admitted = 0

    async def caller() -> None:
        nonlocal admitted
        async with breaker:
            admitted += 1
            await gate.wait()

    tasks = [asyncio.create_task(caller()) for _ in range(100)]
    await asyncio.sleep(0)
    assert admitted == 3
    refused = [t for t in tasks if t.done() and isinstance(t.exception(), CircuitOpenError)]
    assert len(refused) == 97
    assert "probe slots busy" in str(refused[0].exception())
    assert breaker.state is CircuitState.HALF_OPEN
    gate.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert breaker.state is CircuitState.CLOSED


async def test_half_open_needs_all_probes_to_succeed(clock: FakeClock) -> None:
    breaker = make(clock, half_open_requests=2)
    await trip(breaker)
    clock.advance(10.0)
    assert await call(breaker) == "ok"
    assert breaker.state is CircuitState.HALF_OPEN
    await fail(breaker)
    assert breaker.state is CircuitState.OPEN
    assert breaker.snapshot().current_recovery_s == 20.0


async def test_cancelled_probe_frees_its_slot(clock: FakeClock) -> None:
    breaker = make(clock)
    await trip(breaker)
    clock.advance(10.0)
    with pytest.raises(asyncio.CancelledError):
        await call(breaker, asyncio.CancelledError())
    assert breaker.state is CircuitState.HALF_OPEN
    assert await call(breaker) == "ok"
    assert breaker.state is CircuitState.CLOSED


async def test_backoff_doubles_per_failed_probe_up_to_the_cap(clock: FakeClock) -> None:
    breaker = make(clock)
    await trip(breaker)
    seen = []
    for _ in range(5):
        recovery = breaker.snapshot().current_recovery_s
        seen.append(recovery)
        clock.advance(recovery)
        assert breaker.state is CircuitState.HALF_OPEN
        await fail(breaker)
    assert seen == [10.0, 20.0, 40.0, 80.0, 80.0]
    snap = breaker.snapshot()
    assert snap.state is CircuitState.OPEN
    assert snap.retry_after_s == 80.0
    assert snap.opened_at == clock.now


async def test_backoff_decays_per_healthy_period(clock: FakeClock) -> None:
    breaker = make(clock)
    await trip(breaker)
    for _ in range(3):  # 10 -> 20 -> 40 -> 80
        clock.advance(breaker.snapshot().current_recovery_s)
        await fail(breaker)
    clock.advance(80.0)
    assert await call(breaker) == "ok"
    assert breaker.state is CircuitState.CLOSED
    assert breaker.snapshot().current_recovery_s == 80.0
    clock.advance(99.0)
    assert breaker.snapshot().current_recovery_s == 80.0
    clock.advance(1.0)
    assert breaker.snapshot().current_recovery_s == 40.0
    clock.advance(150.0)
    assert breaker.snapshot().current_recovery_s == 20.0
    await trip(breaker)  # opening again uses the decayed backoff
    assert breaker.snapshot().retry_after_s == 20.0
    clock.advance(20.0)
    assert await call(breaker) == "ok"
    clock.advance(10_000.0)
    assert breaker.snapshot().current_recovery_s == 10.0


async def test_probe_that_never_reports_is_failed_after_probe_timeout(clock: FakeClock) -> None:
    breaker = make(clock)
    await trip(breaker)
    clock.advance(10.0)
    hang = asyncio.Event()

    async def stuck_probe() -> None:
        async with breaker:
            await hang.wait()

    probe = asyncio.create_task(stuck_probe())
    await asyncio.sleep(0)
    with pytest.raises(CircuitOpenError):
        await call(breaker)
    clock.advance(5.0)
    assert breaker.state is CircuitState.OPEN
    snap = breaker.snapshot()
    assert snap.current_recovery_s == 20.0
    assert snap.total_failures == 4
    assert snap.opened_at == clock.now
    hang.set()
    await probe  # its late success is stale: the breaker stays open
    assert breaker.state is CircuitState.OPEN
    clock.advance(20.0)
    assert await call(breaker) == "ok"
    assert breaker.state is CircuitState.CLOSED


async def test_long_idle_after_stuck_probe_admits_a_fresh_probe(clock: FakeClock) -> None:
    breaker = make(clock)
    await trip(breaker)
    clock.advance(10.0)
    hang = asyncio.Event()

    async def stuck_probe() -> None:
        async with breaker:
            await hang.wait()

    probe = asyncio.create_task(stuck_probe())
    await asyncio.sleep(0)
    clock.advance(3600.0)
    assert breaker.state is CircuitState.HALF_OPEN
    assert await call(breaker) == "ok"
    hang.set()
    await probe


async def test_late_failures_after_opening_are_not_counted_again(clock: FakeClock) -> None:
    breaker = make(clock)
    gate = asyncio.Event()

    async def slow_failure() -> None:
        async with breaker:
            await gate.wait()
            raise ConnectionError("late")

    tasks = [asyncio.create_task(slow_failure()) for _ in range(6)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    snap = breaker.snapshot()
    assert snap.state is CircuitState.OPEN
    assert snap.total_failures == 6
    assert snap.current_recovery_s == 10.0


async def test_reset_closes_and_forgets_backoff(clock: FakeClock) -> None:
    breaker = make(clock)
    await trip(breaker)
    clock.advance(10.0)
    await fail(breaker)
    assert breaker.snapshot().current_recovery_s == 20.0
    breaker.reset()
    snap = breaker.snapshot()
    assert snap.state is CircuitState.CLOSED
    assert snap.current_recovery_s == 10.0
    assert snap.consecutive_failures == 0
    assert snap.opened_at is None
    assert snap.retry_after_s is None
    assert snap.total_failures == 4


async def test_decorator_form(clock: FakeClock) -> None:
    breaker = make(clock, failure_threshold=2)

    @breaker
    async def fetch(path: str, *, fail: bool = False) -> str:
        """Fetch a path."""
        if fail:
            raise ConnectionError(path)
        return f"got {path}"

    assert fetch.__name__ == "fetch"
    assert await fetch("/a") == "got /a"
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await fetch("/b", fail=True)
    with pytest.raises(CircuitOpenError):
        await fetch("/a")


async def test_listeners_see_every_transition(clock: FakeClock) -> None:
    breaker = make(clock)
    calls: list[tuple[str, CircuitState, CircuitState]] = []

    def broken(name: str, old: CircuitState, new: CircuitState) -> None:
        raise RuntimeError("listener bug")

    breaker.add_listener(broken)
    breaker.add_listener(lambda name, old, new: calls.append((name, old, new)))
    await trip(breaker)
    clock.advance(10.0)
    await fail(breaker)
    clock.advance(20.0)
    await call(breaker)
    await trip(breaker)
    breaker.reset()
    name = "sync-gpu-a"
    assert calls == [
        (name, CircuitState.CLOSED, CircuitState.OPEN),
        (name, CircuitState.OPEN, CircuitState.HALF_OPEN),
        (name, CircuitState.HALF_OPEN, CircuitState.OPEN),
        (name, CircuitState.OPEN, CircuitState.HALF_OPEN),
        (name, CircuitState.HALF_OPEN, CircuitState.CLOSED),
        (name, CircuitState.CLOSED, CircuitState.OPEN),
        (name, CircuitState.OPEN, CircuitState.CLOSED),
    ]


async def test_opening_logs_warning_once_then_debug(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    breaker = make(clock)
    caplog.set_level("DEBUG", logger="health.breaker")
    await trip(breaker)
    for _ in range(3):
        clock.advance(breaker.snapshot().current_recovery_s)
        await fail(breaker)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "opened after 3 consecutive failures" in warnings[0].getMessage()


async def test_flapping_peer_warns_once_per_episode(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    breaker = make(clock)
    caplog.set_level("DEBUG", logger="health.breaker")

    def loud() -> list[str]:
        return [r.levelname for r in caplog.records if r.levelno > 10]

    await trip(breaker)
    clock.advance(10.0)
    await call(breaker)
    assert loud() == ["WARNING", "INFO"]
    for _ in range(3):  # fails again soon after closing: the same episode
        clock.advance(30.0)
        await trip(breaker)
        clock.advance(10.0)
        await call(breaker)
    assert loud() == ["WARNING", "INFO"]
    clock.advance(100.0)  # a healthy period: the next failure is news
    await trip(breaker)
    assert loud() == ["WARNING", "INFO", "WARNING"]


async def test_task_spawned_inside_a_call_has_its_own_ticket(clock: FakeClock) -> None:
    breaker = make(clock)

    async def inner() -> str:
        return await call(breaker)

    async def outer(exc: Exception | None) -> None:
        async with breaker:
            assert await asyncio.create_task(inner()) == "ok"
            if exc is not None:
                raise exc

    await outer(None)
    with pytest.raises(ConnectionError):
        await outer(ConnectionError("outer"))
    assert breaker.snapshot().consecutive_failures == 1
    assert breaker.snapshot().total_successes == 3


async def test_exit_without_enter_is_an_error(clock: FakeClock) -> None:
    breaker = make(clock)
    with pytest.raises(HealthError, match="without a matching enter"):
        await breaker.__aexit__(None, None, None)


def test_config_is_validated() -> None:
    with pytest.raises(HealthConfigError, match="failure_threshold"):
        BreakerConfig(failure_threshold=0)
    with pytest.raises(HealthConfigError, match="half_open_requests"):
        BreakerConfig(half_open_requests=0)
    with pytest.raises(ValueError, match="max_backoff_s"):
        BreakerConfig(recovery_timeout_s=60, max_backoff_s=30)
    with pytest.raises(HealthConfigError, match="probe_timeout_s"):
        BreakerConfig(probe_timeout_s=0)


def test_config_from_timeouts() -> None:
    from config.timeouts import Timeouts

    config = BreakerConfig.from_timeouts(
        Timeouts(breaker_recovery_s=30.0, breaker_probe_s=7.0), failure_threshold=4
    )
    assert (config.failure_threshold, config.recovery_timeout_s, config.probe_timeout_s) == (
        4,
        30.0,
        7.0,
    )


def test_circuit_open_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(CircuitOpenError("gpu-a/http", 12.5)))
    assert (err.name, err.retry_after_s) == ("gpu-a/http", 12.5)


async def test_trip_opens_at_once_and_recovers_like_any_open(clock: FakeClock) -> None:
    breaker = make(clock)
    breaker.trip("served a piece that does not match its hash")
    assert breaker.state is CircuitState.OPEN
    assert breaker.snapshot().total_failures == 1
    with pytest.raises(CircuitOpenError):
        await call(breaker)
    breaker.trip("again")  # already open: stays open, the reopen time unchanged
    clock.advance(10.0)
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.trip("a bad piece while half-open")
    assert breaker.state is CircuitState.OPEN
    assert breaker.snapshot().current_recovery_s == 20.0  # backoff doubled, as a failed probe
