"""LoopHealth: a background loop's rounds as a health component (degraded with the last error
while rounds keep failing)."""

from __future__ import annotations

import pytest

from health import HealthChecker, HealthConfigError, HealthStatus, LoopHealth


async def test_a_loop_that_keeps_failing_is_degraded_with_its_last_error() -> None:
    now = [1000.0]
    loop = LoopHealth("sync", failures_to_degrade=2, wall_clock=lambda: now[0])
    checker = HealthChecker()
    checker.add_check("sync", loop.check)
    assert (await checker.run_check("sync")).status is HealthStatus.HEALTHY
    loop.record_failure(ConnectionError("gpu-b refused"))
    assert (await checker.run_check("sync")).status is HealthStatus.HEALTHY  # one blip
    now[0] += 30
    loop.record_failure("gpu-c: manifest: timed out")
    now[0] += 5
    component = await checker.run_check("sync")
    assert component.status is HealthStatus.DEGRADED
    assert component.message == (
        "sync loop failed 2 rounds in a row; last error 5 s ago: gpu-c: manifest: timed out"
    )
    assert component.metrics["consecutive_failures"] == 2
    assert checker.summary().status is HealthStatus.DEGRADED
    loop.record_success("3 files from 2 peers")
    component = await checker.run_check("sync")
    assert (component.status, component.message) == (HealthStatus.HEALTHY, "3 files from 2 peers")


def test_exception_text_and_bad_threshold() -> None:
    loop = LoopHealth("discovery", failures_to_degrade=1)
    loop.record_failure(TimeoutError())
    assert loop.failing
    assert loop.last_error == "TimeoutError"
    with pytest.raises(HealthConfigError, match="failures_to_degrade"):
        LoopHealth("x", failures_to_degrade=0)
