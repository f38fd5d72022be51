"""HealthChecker: runs named checks with timeouts and hysteresis, in the background or on demand.

A component turns unhealthy after N failures in a row and healthy after M successes in a row.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from config.closing import AsyncClosing
from config.timeouts import Timeouts
from health.breaker_config import Clock
from health.errors import HealthConfigError, HealthError
from health.status import (
    CheckFn,
    CheckResult,
    ComponentHealth,
    HealthStatus,
    HealthSummary,
    SummaryListener,
    summarize,
)

__all__ = ["HealthChecker"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Streak:
    """Hysteresis state of one component; `recovering` after any failure until M successes."""

    status: HealthStatus
    failures: int = 0
    successes: int = 0
    recovering: bool = False


def _apply(
    prev: _Streak, raw: HealthStatus, fail_threshold: int, recover_threshold: int
) -> _Streak:
    if raw is HealthStatus.NOT_APPLICABLE:
        return _Streak(raw)
    if raw is HealthStatus.UNHEALTHY:
        failures = prev.failures + 1
        status = HealthStatus.UNHEALTHY if failures >= fail_threshold else HealthStatus.DEGRADED
        return _Streak(status, failures=failures, recovering=True)
    if raw is HealthStatus.DEGRADED:
        return _Streak(raw, recovering=prev.recovering)
    if not prev.recovering:
        return _Streak(raw)
    successes = prev.successes + 1
    if successes >= recover_threshold:
        return _Streak(raw)
    return _Streak(HealthStatus.DEGRADED, successes=successes, recovering=True)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.3g}"


@dataclass(frozen=True)
class _Check:
    name: str
    fn: CheckFn
    interval_s: float
    timeout_s: float
    fail_threshold: int
    recover_threshold: int


class HealthChecker(AsyncClosing):
    """Runs named checks, each with its interval and timeout, and keeps their latest health.

    The background loop is `run_forever()` (for the caller's task group) or `async with checker:`
    (runs the first round, then loops until `close()`).
    """

    def __init__(
        self,
        *,
        timeouts: Timeouts | None = None,
        fail_threshold: int = 2,
        recover_threshold: int = 2,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        _require_threshold("fail_threshold", fail_threshold)
        _require_threshold("recover_threshold", recover_threshold)
        self._default_timeout_s = (timeouts or Timeouts()).health_check_s
        self._fail_threshold = fail_threshold
        self._recover_threshold = recover_threshold
        self._clock = clock
        self._wall_clock = wall_clock
        self._checks: dict[str, _Check] = {}
        self._streaks: dict[str, _Streak] = {}
        self._components: dict[str, ComponentHealth] = {}
        self._last_run: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Task[ComponentHealth]] = {}
        self._listeners: list[SummaryListener] = []
        self._checks_changed = asyncio.Event()
        self._looping: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def add_check(
        self,
        name: str,
        fn: CheckFn,
        interval_s: float = 30.0,
        timeout_s: float | None = None,
        *,
        fail_threshold: int | None = None,
        recover_threshold: int | None = None,
    ) -> None:
        """Register `fn` as component `name`, run every `interval_s`, failed after `timeout_s`."""
        if name in self._checks:
            raise HealthConfigError(f"a health check named {name!r} is already registered")
        timeout = self._default_timeout_s if timeout_s is None else timeout_s
        if not interval_s > 0 or not timeout > 0:
            raise HealthConfigError(
                f"check {name!r}: interval_s and timeout_s must be positive, "
                f"got {interval_s} and {timeout}"
            )
        fails = self._fail_threshold if fail_threshold is None else fail_threshold
        recovers = self._recover_threshold if recover_threshold is None else recover_threshold
        _require_threshold("fail_threshold", fails)
        _require_threshold("recover_threshold", recovers)
        self._checks[name] = _Check(name, fn, interval_s, timeout, fails, recovers)
        self._streaks[name] = _Streak(HealthStatus.DEGRADED)
        self._components[name] = ComponentHealth(
            name, HealthStatus.DEGRADED, "not checked yet", None, {}
        )
        self._checks_changed.set()

    def remove_check(self, name: str) -> None:
        """Forget component `name`; its background loop ends after its current run."""
        if self._checks.pop(name, None) is None:
            raise HealthError(f"no health check named {name!r}")
        for table in (self._streaks, self._components, self._last_run):
            table.pop(name, None)

    def add_listener(self, listener: SummaryListener) -> None:
        """Call `listener(summary)` after every run; its errors are logged only."""
        self._listeners.append(listener)

    def report(self, name: str, result: CheckResult) -> ComponentHealth:
        """Record `result` for component `name` now, as a check run would, except that an
        unhealthy report counts at once: it is an observed failure (a write that failed), not a
        probe that may flake. The component recovers through its check's successes as usual."""
        check = self._checks.get(name)
        if check is None:
            raise HealthError(f"no health check named {name!r}")
        prev = self._streaks[name]
        if result.status is HealthStatus.UNHEALTHY:
            streak = _Streak(HealthStatus.UNHEALTHY, failures=check.fail_threshold, recovering=True)
        else:
            streak = _apply(prev, result.status, check.fail_threshold, check.recover_threshold)
        self._streaks[name] = streak
        component = ComponentHealth(
            name, streak.status, result.message, self._wall_clock(), dict(result.metrics)
        )
        self._components[name] = component
        _log_change(name, prev.status, streak.status, result.message, first=False)
        self._notify()
        return component

    def summary(self) -> HealthSummary:
        """The latest health of every component, without running anything."""
        return summarize(tuple(self._components[name] for name in self._checks))

    async def run_check(self, name: str) -> ComponentHealth:
        """Run check `name` now (or join its run in progress) and return its component health."""
        component = await self._run(name)
        self._notify()
        return component

    async def run_checks(self) -> HealthSummary:
        """Run every check now, concurrently, and return the new summary."""
        await asyncio.gather(*(self._run(name) for name in list(self._checks)))
        self._notify()
        return self.summary()

    async def run_forever(self) -> None:
        """Run each check at its interval until cancelled; picks up checks added later."""
        async with asyncio.TaskGroup() as group:
            while True:
                self._checks_changed.clear()
                for name in self._checks:
                    if name not in self._looping:
                        self._looping.add(name)
                        group.create_task(self._loop(name), name=f"health-check-{name}")
                await self._checks_changed.wait()

    async def start(self) -> None:
        """Run the first round of checks, then keep running them in the background."""
        if self._closed:
            raise HealthError("health checker is closed; create a new one")
        if self._task is not None:
            raise HealthError("health checker is already started")
        await self.run_checks()
        self._task = asyncio.create_task(self.run_forever(), name="health-checker")

    async def close(self) -> None:
        """Stop the background loop and any check in progress. Idempotent and irreversible."""
        self._closed = True
        tasks = [t for t in (self._task, *self._inflight.values()) if t is not None]
        self._task = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                logger.error("health check loop failed", exc_info=task.exception())

    async def _enter(self) -> None:
        await self.start()

    async def _loop(self, name: str) -> None:
        try:
            while (check := self._checks.get(name)) is not None:
                last = self._last_run.get(name)
                wait_s = 0.0 if last is None else last + check.interval_s - self._clock()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                    continue
                await self.run_check(name)
        finally:
            self._looping.discard(name)

    async def _run(self, name: str) -> ComponentHealth:
        check = self._checks.get(name)
        if check is None:
            raise HealthError(f"no health check named {name!r}")
        task = self._inflight.get(name)
        if task is None:
            task = asyncio.create_task(self._execute(check), name=f"health-run-{name}")
            self._inflight[name] = task

            def forget(done: asyncio.Task[ComponentHealth]) -> None:
                if self._inflight.get(name) is done:
                    del self._inflight[name]

            task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _execute(self, check: _Check) -> ComponentHealth:
        result = await _outcome(check)
        if self._checks.get(check.name) is not check:
            return ComponentHealth(check.name, result.status, result.message, None, result.metrics)
        first = check.name not in self._last_run
        prev = self._streaks[check.name]
        streak = _apply(prev, result.status, check.fail_threshold, check.recover_threshold)
        self._streaks[check.name] = streak
        self._last_run[check.name] = self._clock()
        component = ComponentHealth(
            check.name, streak.status, result.message, self._wall_clock(), dict(result.metrics)
        )
        self._components[check.name] = component
        _log_change(check.name, prev.status, streak.status, result.message, first=first)
        return component

    def _notify(self) -> None:
        if not self._listeners:
            return
        summary = self.summary()
        for listener in list(self._listeners):
            try:
                listener(summary)
            except Exception:
                logger.warning("health listener %r failed", listener, exc_info=True)


async def _outcome(check: _Check) -> CheckResult:
    """Run one check; raising, hanging past its timeout or a wrong return is unhealthy."""
    timer = asyncio.timeout(check.timeout_s)
    try:
        async with timer:
            result: object = await check.fn()
    except TimeoutError as exc:
        if timer.expired():
            message = f"check {check.name!r} timed out after {_fmt_s(check.timeout_s)} s"
        else:
            message = f"check {check.name!r} raised TimeoutError: {exc}"
        return CheckResult(HealthStatus.UNHEALTHY, message)
    except Exception as exc:
        return CheckResult(
            HealthStatus.UNHEALTHY, f"check {check.name!r} raised {type(exc).__name__}: {exc}"
        )
    if not isinstance(result, CheckResult):
        return CheckResult(
            HealthStatus.UNHEALTHY,
            f"check {check.name!r} returned {type(result).__name__}, not a CheckResult",
        )
    return result


def _log_change(
    name: str, old: HealthStatus, new: HealthStatus, message: str, *, first: bool
) -> None:
    if first and new in (HealthStatus.HEALTHY, HealthStatus.NOT_APPLICABLE):
        logger.debug("health: %s is %s: %s", name, new.value, message)
    elif new is old:
        if new in (HealthStatus.DEGRADED, HealthStatus.UNHEALTHY):
            logger.debug("health: %s still %s: %s", name, new.value, message)
    elif new is HealthStatus.UNHEALTHY:
        logger.warning("health: %s is unhealthy: %s", name, message)
    else:
        logger.info("health: %s is %s (was %s): %s", name, new.value, old.value, message)


def _require_threshold(name: str, value: int) -> None:
    if value < 1:
        raise HealthConfigError(f"{name} must be at least 1, got {value}")
