"""Health against the real WriteAheadLog: the WAL checks, and NodeMetrics as its observer."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from health import HealthChecker, HealthStatus, NodeMetrics, wal_backlog_check, wal_check
from wal import WriteAheadLog


def metric_values(metrics: NodeMetrics) -> dict[str, float]:
    body, _ = metrics.render()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if not sample.labels
    }


async def test_wal_checks_and_observer_on_a_real_wal(tmp_path: Path) -> None:
    metrics = NodeMetrics("gpu-a")
    checker = HealthChecker(fail_threshold=1)
    async with WriteAheadLog(tmp_path / "wal.db", observer=metrics) as wal:
        checker.add_check("wal", wal_check(wal, slow_write_s=60.0))
        checker.add_check("wal_backlog", wal_backlog_check(wal, 2, 3))
        summary = await checker.run_checks()
        assert summary.status is HealthStatus.HEALTHY, summary
        assert await wal.state_get("health.probe") is not None

        for game in range(3):
            await wal.append("game_recorded", {"game": game})
        summary = await checker.run_checks()
        backlog = summary.component("wal_backlog")
        assert backlog is not None
        assert backlog.status is HealthStatus.UNHEALTHY
        assert backlog.message.startswith("3 pending entries")
        assert backlog.metrics["pending"] == 3

    values = metric_values(metrics)
    assert values["shoal_wal_append_seconds_count"] == 3
    assert values["shoal_wal_pending_entries"] == 3

    component = await checker.run_check("wal")  # the log is closed now
    assert component.status is HealthStatus.UNHEALTHY
    assert component.message.startswith("check 'wal' raised WalError")
