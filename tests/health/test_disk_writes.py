"""The disk component hears of a failed write at once and stays unhealthy until the path is
written again or its filesystem has space back."""

from __future__ import annotations

from pathlib import Path

from health import CheckResult, DiskWrites, HealthChecker, HealthStatus, disk_check
from health.checks import SPACE_RETURNED_BYTES

GIB = 1 << 30


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
    # other processes write to this filesystem too (the suite runs in parallel), so the
    # check's own reading is compared with margins far above what they write meanwhile
    writes = DiskWrites()
    check = disk_check(tmp_path, 99.9, 100.0, writes=writes)
    free_now = int((await check()).metrics["free_bytes"])
    writes.failed(tmp_path / "g.db", "the disk is full", free_now + GIB)
    assert (await check()).status is HealthStatus.UNHEALTHY  # no space came back
    writes.failed(tmp_path / "g.db", "the disk is full", free_now - GIB)
    assert (await check()).status is HealthStatus.HEALTHY
    assert writes.failures == ()


def test_space_returned_means_the_threshold_more_than_then() -> None:
    writes = DiskWrites()
    writes.failed("/data/g.db", "the disk is full", 1000)
    writes.forget_where_space_returned(lambda path: 1000 + SPACE_RETURNED_BYTES - 1)
    assert len(writes.failures) == 1
    writes.forget_where_space_returned(lambda path: None)  # unknown: kept
    assert len(writes.failures) == 1
    writes.forget_where_space_returned(lambda path: 1000 + SPACE_RETURNED_BYTES)
    assert writes.failures == ()
