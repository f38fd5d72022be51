"""The disk component hears of a failed write at once and stays unhealthy until the path is
written again or its filesystem has space back."""

from __future__ import annotations

from pathlib import Path

from health import CheckResult, DiskWrites, HealthChecker, HealthStatus, disk_check
from health.checks import SPACE_RETURNED_BYTES


async def test_a_reported_failure_is_unhealthy_at_once_despite_the_fail_threshold(
    tmp_path: Path,
) -> None:
    writes = DiskWrites()
    checker = HealthChecker(fail_threshold=3)
    checker.add_check("disk", disk_check(tmp_path, 99.9, 100.0, writes=writes))
    free = int((await checker.run_check("disk")).metrics["free_bytes"])
    writes.add_listener(
        lambda failure: checker.report(
            "disk", CheckResult(HealthStatus.UNHEALTHY, failure.describe())
        )
    )
    writes.failed(tmp_path / "g.db", "the disk is full", free)
    component = checker.summary().component("disk")
    assert component is not None
    assert component.status is HealthStatus.UNHEALTHY
    assert f"g.db failed ({free} bytes free): the disk is full" in component.message
    # the periodic check keeps it unhealthy while the failure stands ...
    assert (await checker.run_check("disk")).status is HealthStatus.UNHEALTHY
    # ... and recovers (after its recover threshold) once the path was written again
    writes.succeeded(tmp_path / "g.db")
    await checker.run_check("disk")
    assert (await checker.run_check("disk")).status is HealthStatus.HEALTHY


async def test_a_failure_is_forgotten_when_space_returned(tmp_path: Path) -> None:
    writes = DiskWrites()
    check = disk_check(tmp_path, 99.9, 100.0, writes=writes)
    free_now = (await check()).metrics["free_bytes"]
    writes.failed(tmp_path / "g.db", "the disk is full", int(free_now))
    assert (await check()).status is HealthStatus.UNHEALTHY  # no space came back
    writes.failed(tmp_path / "g.db", "the disk is full", int(free_now) - SPACE_RETURNED_BYTES)
    assert (await check()).status is HealthStatus.HEALTHY
    assert writes.failures == ()
