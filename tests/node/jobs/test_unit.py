"""The shipped systemd unit lets jobs outlive `systemctl restart shoal`."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[3] / "config" / "systemd" / "shoal.service"


def test_restart_signals_only_the_daemon_so_jobs_keep_running() -> None:
    lines = UNIT.read_text().splitlines()
    assert "KillMode=process" in lines
    assert not any(line.startswith("KillMode=") and line != "KillMode=process" for line in lines)
