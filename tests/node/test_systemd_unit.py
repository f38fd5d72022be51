from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.skips import skip_unless_required

UNIT = Path(__file__).resolve().parents[2] / "config" / "systemd" / "shoal.service"


def test_unit_declares_notify_watchdog_restart_and_keeps_gpus() -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "Restart=on-failure",
        "RestartSec=5",
        "WatchdogSec=120",
        "StateDirectory=shoal",
        "User=shoal",
    ):
        assert line in text.splitlines(), line
    directives = [line.split("=", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert "PrivateDevices" not in directives, "GPUs must stay visible"


def test_systemd_analyze_verify_is_silent(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        skip_unless_required("systemd-analyze is not installed (Debian package systemd)")
    shoal = Path(sys.executable).parent / "shoal"
    assert shoal.exists(), "the shoal console script must be installed in the venv"
    unit = tmp_path / "shoal.service"
    unit.write_text(UNIT.read_text().replace("/opt/shoal/.venv/bin/shoal", str(shoal)))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert result.stdout + result.stderr == ""
