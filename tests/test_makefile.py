"""The Makefile's installs: `make run` installs what running a node needs (no test tools, no
torch or ray extras); `make test` installs everything its gates run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = re.compile(r"pip install -e '?\.(?:\[(?P<extras>[^\]]*)\])?'?")


def installed_extras(target: str, venv: Path) -> list[set[str]]:
    """The extras of each `pip install -e .` that `make -n TARGET` would run for a fresh
    `venv` (a dry run: nothing is installed or started)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    installs = [match["extras"] or "" for match in INSTALL.finditer(result.stdout)]
    assert installs, f"make -n {target} installs nothing:\n{result.stdout}"
    return [{extra.strip() for extra in extras.split(",") if extra.strip()} for extras in installs]


def test_run_installs_no_test_tools_and_no_ray(tmp_path: Path) -> None:
    for extras in installed_extras("run", tmp_path / "venv"):
        assert not extras & {"test", "ray"}, f"make run installs the extras {sorted(extras)}"


def test_test_installs_the_test_tools_torch_and_ray(tmp_path: Path) -> None:
    assert {"test", "torch", "ray"} in installed_extras("pytest", tmp_path / "venv")
