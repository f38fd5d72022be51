"""Built-in checks: disk space on a small real tmpfs, WAL latency and backlog, process memory."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from health import (
    HealthChecker,
    HealthConfigError,
    HealthStatus,
    disk_check,
    memory_check,
    read_rss_bytes,
    wal_backlog_check,
    wal_check,
)
from tests.skips import skip_unless_required

MIB = 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for this test (needs root)."""
    if os.geteuid() != 0:
        skip_unless_required("mounting a size-limited tmpfs needs root")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        skip_unless_required(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill(path: Path, size_bytes: int) -> None:
    with path.open("ab") as out:
        out.write(b"\0" * size_bytes)
        out.flush()
        os.fsync(out.fileno())


async def test_disk_check_grades_a_filling_filesystem(small_fs: Path) -> None:
    check = disk_check(small_fs, degraded_pct=50, unhealthy_pct=80)
    result = await check()
    assert result.status is HealthStatus.HEALTHY
    assert result.metrics["total_bytes"] == 4 * MIB
    assert result.metrics["used_pct"] < 5

    fill(small_fs / "data", int(2.4 * MIB))
    result = await check()
    assert result.status is HealthStatus.DEGRADED
    assert 55 < result.metrics["used_pct"] < 65
    assert "(degraded from 50%)" in result.message

    fill(small_fs / "data", int(1.2 * MIB))
    result = await check()
    assert result.status is HealthStatus.UNHEALTHY
    assert result.metrics["used_pct"] > 85
    assert result.message.startswith(f"{small_fs}: ")
    assert "(unhealthy from 80%)" in result.message

    with pytest.raises(OSError, match="No space left"):
        fill(small_fs / "more", 2 * MIB)
    result = await check()
    assert result.metrics["free_bytes"] == 0
    assert result.metrics["used_pct"] == 100


async def test_disk_check_of_a_missing_directory(tmp_path: Path) -> None:
    result = await disk_check(tmp_path / "gone")()
    assert result.status is HealthStatus.UNHEALTHY
    assert "cannot read free space" in result.message


def test_thresholds_are_validated() -> None:
    with pytest.raises(HealthConfigError, match="must not exceed"):
        disk_check("/", degraded_pct=95, unhealthy_pct=90)
    with pytest.raises(HealthConfigError, match="negative"):
        memory_check(degraded_rss_mb=-1)


@dataclass(frozen=True)
class FakeStats:
    pending: int
    oldest_pending_age_s: float | None


class FakeWal:
    """Stands in at the WAL seam: records state writes, serves fixed stats."""

    def __init__(self, stats: FakeStats | None = None, error: Exception | None = None) -> None:
        self.stats_value = stats or FakeStats(0, None)
        self.error = error
        self.state: dict[str, Any] = {}

    async def stats(self) -> FakeStats:
        return self.stats_value

    async def state_set(self, key: str, value: Any) -> None:
        if self.error is not None:
            raise self.error
        self.state[key] = value


async def test_wal_check_writes_the_probe_key() -> None:
    wal = FakeWal()
    result = await wal_check(wal, slow_write_s=10.0)()
    assert result.status is HealthStatus.HEALTHY
    assert "health.probe" in wal.state
    assert result.metrics["write_s"] >= 0
    slow = await wal_check(wal, slow_write_s=0.0)()
    assert slow.status is HealthStatus.DEGRADED
    assert "slow from 0 ms" in slow.message


async def test_wal_check_failure_through_the_checker() -> None:
    checker = HealthChecker(fail_threshold=1)
    checker.add_check("wal", wal_check(FakeWal(error=OSError("disk I/O error"))))
    component = await checker.run_check("wal")
    assert component.status is HealthStatus.UNHEALTHY
    assert component.message == "check 'wal' raised OSError: disk I/O error"


@pytest.mark.parametrize(
    ("pending", "age_s", "status"),
    [
        (0, None, HealthStatus.HEALTHY),
        (5, 10.0, HealthStatus.HEALTHY),
        (100, 10.0, HealthStatus.DEGRADED),
        (1000, 10.0, HealthStatus.UNHEALTHY),
        (5, 60.0, HealthStatus.DEGRADED),
        (5, 600.0, HealthStatus.UNHEALTHY),
        (100, 600.0, HealthStatus.UNHEALTHY),
    ],
)
async def test_wal_backlog_check(pending: int, age_s: float | None, status: HealthStatus) -> None:
    check = wal_backlog_check(
        FakeWal(FakeStats(pending, age_s)),
        degraded_pending=100,
        unhealthy_pending=1000,
        degraded_age_s=60,
        unhealthy_age_s=600,
    )
    result = await check()
    assert result.status is status
    assert result.message.startswith(f"{pending} pending entries")
    assert result.metrics["pending"] == pending
    if age_s is None:
        assert "oldest_pending_age_s" not in result.metrics


async def test_memory_check_reads_this_process() -> None:
    rss = read_rss_bytes()
    assert rss is not None
    assert rss > MIB
    assert (await memory_check()()).status is HealthStatus.HEALTHY
    tight = await memory_check(degraded_rss_mb=0.5, unhealthy_rss_mb=1.0)()
    assert tight.status is HealthStatus.UNHEALTHY
    assert "unhealthy from 1 MiB" in tight.message
    assert tight.metrics["rss_mb"] > 1


async def test_memory_check_without_proc(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tshoal\nVmRSS:\t  2048 kB\n")
    assert read_rss_bytes(status) == 2 * MIB
    status.write_text("Name:\tshoal\n")
    result = await memory_check(status_path=status)()
    assert result.status is HealthStatus.NOT_APPLICABLE
    assert read_rss_bytes(tmp_path / "missing") is None
