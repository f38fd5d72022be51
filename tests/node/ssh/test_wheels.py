"""The wheel `shoal deploy` builds from the running source carries every file the package needs at
run time, the dashboard's static assets included."""

from __future__ import annotations

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
