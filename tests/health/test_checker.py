"""HealthChecker: failing, raising and hanging checks, hysteresis, the loop, the report."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from health import (
    CheckFn,
    CheckResult,
    HealthChecker,
    HealthConfigError,
    HealthError,
    HealthStatus,
    HealthSummary,
    format_health_report,
)

OK = CheckResult(HealthStatus.HEALTHY, "all good", {"value": 1.0})
BAD = CheckResult(HealthStatus.UNHEALTHY, "it broke")


def scripted(*results: CheckResult) -> CheckFn:
    """A check returning `results` in turn, then the last one forever."""
    queue = list(results)

    async def check() -> CheckResult:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return check


async def hang() -> CheckResult:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_all_healthy() -> None:
    checker = HealthChecker()
    checker.add_check("disk", scripted(OK))
    checker.add_check("wal", scripted(OK))
    summary = await checker.run_checks()
    assert summary.status is HealthStatus.HEALTHY
    assert [c.name for c in summary.components] == ["disk", "wal"]
    disk = summary.component("disk")
    assert disk is not None
    assert disk.message == "all good"
    assert disk.metrics == {"value": 1.0}
    assert disk.last_check is not None


async def test_failing_check_turns_unhealthy_after_two_and_healthy_after_two() -> None:
    checker = HealthChecker()
    checker.add_check("disk", scripted(BAD, BAD, OK, OK))
    statuses = [(await checker.run_checks()).status for _ in range(4)]
    assert statuses == [
        HealthStatus.DEGRADED,
        HealthStatus.UNHEALTHY,
        HealthStatus.DEGRADED,
        HealthStatus.HEALTHY,
    ]


async def test_in_between_reports_degraded_with_latest_message() -> None:
    checker = HealthChecker(fail_threshold=3, recover_threshold=2)
    checker.add_check("disk", scripted(BAD, BAD, OK, BAD, BAD, BAD))
    for _ in range(3):
        component = await checker.run_check("disk")
    assert component.status is HealthStatus.DEGRADED
    assert component.message == "all good"
    for _ in range(2):
        component = await checker.run_check("disk")
    assert component.status is HealthStatus.DEGRADED  # the success broke the row of failures
    assert component.message == "it broke"
    component = await checker.run_check("disk")
    assert component.status is HealthStatus.UNHEALTHY


async def test_per_check_thresholds() -> None:
    checker = HealthChecker()
    checker.add_check("gpu", scripted(BAD, OK), fail_threshold=1, recover_threshold=1)
    assert (await checker.run_check("gpu")).status is HealthStatus.UNHEALTHY
    assert (await checker.run_check("gpu")).status is HealthStatus.HEALTHY


async def test_raising_check_is_unhealthy_with_the_error() -> None:
    async def broken() -> CheckResult:
        raise OSError("database is locked")

    checker = HealthChecker(fail_threshold=1)
    checker.add_check("wal", broken)
    component = await checker.run_check("wal")
    assert component.status is HealthStatus.UNHEALTHY
    assert component.message == "check 'wal' raised OSError: database is locked"


async def test_hanging_check_times_out() -> None:
    checker = HealthChecker(fail_threshold=1)
    checker.add_check("disk", hang, timeout_s=0.02)
    checker.add_check("ok", scripted(OK))
    summary = await checker.run_checks()
    disk = summary.component("disk")
    assert disk is not None
    assert disk.status is HealthStatus.UNHEALTHY
    assert disk.message == "check 'disk' timed out after 0.02 s"
    assert summary.status is HealthStatus.UNHEALTHY


async def test_timeout_error_raised_by_the_check_itself_is_not_a_hang() -> None:
    async def times_out() -> CheckResult:
        raise TimeoutError("peer did not answer")

    checker = HealthChecker(fail_threshold=1)
    checker.add_check("peer", times_out, timeout_s=5.0)
    component = await checker.run_check("peer")
    assert component.message == "check 'peer' raised TimeoutError: peer did not answer"


async def test_wrong_return_type_is_unhealthy() -> None:
    async def wrong() -> CheckResult:
        return "fine"  # type: ignore[return-value]

    checker = HealthChecker(fail_threshold=1)
    checker.add_check("odd", wrong)
    component = await checker.run_check("odd")
    assert component.status is HealthStatus.UNHEALTHY
    assert "returned str, not a CheckResult" in component.message


async def test_not_applicable_does_not_worsen_the_summary() -> None:
    checker = HealthChecker()
    checker.add_check("gpu", scripted(CheckResult(HealthStatus.NOT_APPLICABLE, "no GPU")))
    checker.add_check("disk", scripted(OK))
    summary = await checker.run_checks()
    assert summary.status is HealthStatus.HEALTHY
    gpu = summary.component("gpu")
    assert gpu is not None
    assert gpu.status is HealthStatus.NOT_APPLICABLE


async def test_degraded_result_is_reported_at_once() -> None:
    checker = HealthChecker()
    checker.add_check("disk", scripted(CheckResult(HealthStatus.DEGRADED, "85% used"), OK))
    assert (await checker.run_checks()).status is HealthStatus.DEGRADED
    assert (await checker.run_checks()).status is HealthStatus.HEALTHY


def test_summary_before_any_run_and_without_checks() -> None:
    checker = HealthChecker()
    assert checker.summary() == HealthSummary(HealthStatus.HEALTHY, ())
    checker.add_check("disk", scripted(OK))
    component = checker.summary().component("disk")
    assert component is not None
    assert (component.status, component.message) == (HealthStatus.DEGRADED, "not checked yet")
    assert component.last_check is None


def test_registration_is_validated() -> None:
    checker = HealthChecker()
    checker.add_check("disk", scripted(OK))
    with pytest.raises(HealthConfigError, match="already registered"):
        checker.add_check("disk", scripted(OK))
    with pytest.raises(HealthConfigError, match="positive"):
        checker.add_check("wal", scripted(OK), timeout_s=0)
    with pytest.raises(HealthConfigError, match="fail_threshold"):
        checker.add_check("gpu", scripted(OK), fail_threshold=0)
    with pytest.raises(HealthError, match="no health check named"):
        checker.remove_check("nope")


async def test_to_dict_is_json() -> None:
    checker = HealthChecker(wall_clock=lambda: 1700000000.0)
    checker.add_check("disk", scripted(OK))
    data = json.loads(json.dumps((await checker.run_checks()).to_dict()))
    assert data == {
        "status": "healthy",
        "components": [
            {
                "name": "disk",
                "status": "healthy",
                "message": "all good",
                "last_check": 1700000000.0,
                "metrics": {"value": 1.0},
            }
        ],
    }


async def test_format_health_report() -> None:
    checker = HealthChecker(fail_threshold=1, wall_clock=lambda: 1000.0)
    checker.add_check("disk", scripted(OK))
    checker.add_check("wal", scripted(BAD))
    checker.add_check("gpu", scripted(CheckResult(HealthStatus.NOT_APPLICABLE, "no GPU")))
    text = format_health_report(await checker.run_checks(), now=1012.0, show_metrics=True)
    lines = text.splitlines()
    assert lines[0] == "health: UNHEALTHY (1 healthy, 1 unhealthy, 1 not_applicable)"
    assert lines[1].startswith("  [  ok] disk")
    assert "all good  (12 s ago)" in lines[1]
    assert "value=1" in lines[2]
    assert lines[3].startswith("  [FAIL] wal ")
    assert "it broke" in lines[3]
    assert lines[4].startswith("  [ n/a] gpu ")
    assert "(no checks registered)" in format_health_report(HealthChecker().summary())


async def test_concurrent_runs_of_one_check_share_one_execution() -> None:
    release = asyncio.Event()
    calls = 0

    async def slow() -> CheckResult:
        nonlocal calls
        calls += 1
        await release.wait()
        return BAD

    checker = HealthChecker()
    checker.add_check("slow", slow)
    first = asyncio.create_task(checker.run_checks())
    second = asyncio.create_task(checker.run_check("slow"))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, second)
    assert calls == 1
    assert checker.summary().status is HealthStatus.DEGRADED  # one failure, not two


async def test_cancelling_the_caller_propagates() -> None:
    checker = HealthChecker()
    checker.add_check("hung", hang, timeout_s=60.0)
    task = asyncio.create_task(checker.run_checks())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await checker.close()


async def test_background_loop_runs_each_check_at_its_interval() -> None:
    counts = {"fast": 0, "late": 0}
    enough = asyncio.Event()

    def counting(name: str) -> CheckFn:
        async def check() -> CheckResult:
            counts[name] += 1
            if counts["fast"] >= 3 and counts["late"] >= 2:
                enough.set()
            return OK

        return check

    summaries: list[HealthSummary] = []
    checker = HealthChecker()
    checker.add_listener(summaries.append)
    checker.add_check("fast", counting("fast"), interval_s=0.001)
    checker.add_check("slow", scripted(OK), interval_s=3600.0)
    async with checker:
        assert counts["fast"] >= 1  # start() ran the first round
        checker.add_check("late", counting("late"), interval_s=0.001)
        async with asyncio.timeout(10):
            await enough.wait()
    stopped_at = dict(counts)
    await asyncio.sleep(0.01)
    assert counts == stopped_at
    assert summaries
    assert summaries[-1].status is HealthStatus.HEALTHY
    await checker.close()  # idempotent
    with pytest.raises(HealthError, match="closed"):
        await checker.start()


async def test_run_forever_in_a_task_group() -> None:
    ran = asyncio.Event()

    async def check() -> CheckResult:
        ran.set()
        return OK

    checker = HealthChecker()
    checker.add_check("disk", check, interval_s=0.001)
    async with asyncio.TaskGroup() as group:
        loop = group.create_task(checker.run_forever())
        async with asyncio.timeout(10):
            await ran.wait()
        loop.cancel()
    assert loop.cancelled()
    assert checker.summary().status is HealthStatus.HEALTHY


async def test_unhealthy_is_logged_once_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="health.checker")
    checker = HealthChecker()
    checker.add_check("disk", scripted(BAD))
    for _ in range(5):
        await checker.run_checks()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == ["health: disk is unhealthy: it broke"]


async def test_listener_errors_do_not_break_runs() -> None:
    def broken(summary: HealthSummary) -> None:
        raise RuntimeError("listener bug")

    checker = HealthChecker()
    checker.add_listener(broken)
    checker.add_check("disk", scripted(OK))
    assert (await checker.run_checks()).status is HealthStatus.HEALTHY
