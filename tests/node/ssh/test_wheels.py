"""The wheel `shoal deploy` builds from the running source carries every file the package needs at
run time, the dashboard's static assets included."""

from __future__ import annotations

import tomllib
import zipfile
from importlib import resources
from pathlib import Path

from node.ssh.wheels import build_shoal_wheel


def test_the_deployed_wheel_carries_the_dashboard_assets(tmp_path: Path) -> None:
    wheel = build_shoal_wheel(tmp_path)
    with zipfile.ZipFile(wheel.path) as archive:
        names = set(archive.namelist())
    static = resources.files("node.ui") / "static"
    assets = sorted(f"node/ui/static/{item.name}" for item in static.iterdir() if item.is_file())
    assert assets, "node/ui/static holds the dashboard's files"
    assert [name for name in assets if name not in names] == []
    assert "node/daemon.py" in names


def test_the_deployed_wheel_carries_every_package_the_project_installs(tmp_path: Path) -> None:
    """The packages of pyproject.toml (the public `shoal` among them: node.training imports it)
    are each in the wheel a deploy pushes; a host upgraded with a wheel short of one fails to
    start."""
    project = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    packages = project["tool"]["mypy"]["packages"]
    wheel = build_shoal_wheel(tmp_path)
    with zipfile.ZipFile(wheel.path) as archive:
        names = set(archive.namelist())
    assert [p for p in packages if f"{p}/__init__.py" not in names] == []
    assert "shoal/session.py" in names
