"""The shipped unit stays hardened (exposure <= 3.0) without hiding GPUs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "config" / "systemd" / "shoal.service"
MAX_EXPOSURE = 3.0


def _analyze() -> str:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("SHOAL_REQUIRE_NETNS") == "1":
            pytest.fail("systemd-analyze is missing: .ci/sysdeps.sh installs the systemd package")
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    return analyze


def test_security_exposure_is_at_most_three(tmp_path: Path) -> None:
    unit = tmp_path / "shoal.service"
    unit.write_text(UNIT.read_text())
    result = subprocess.run(
        [_analyze(), "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for shoal\.service: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match.group(1))
    print(f"systemd-analyze security exposure: {exposure}")
    assert exposure <= MAX_EXPOSURE


def test_gpu_hiding_options_are_left_out() -> None:
    directives = {
        line.split("=", 1)[0].strip()
        for line in UNIT.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    }
    for hides_gpus in ("PrivateDevices", "DevicePolicy", "MemoryDenyWriteExecute", "PrivateUsers"):
        assert hides_gpus not in directives, f"{hides_gpus} would hide or break GPUs"
    assert "UMask=0027" in UNIT.read_text().splitlines(), "files the daemon creates stay private"
