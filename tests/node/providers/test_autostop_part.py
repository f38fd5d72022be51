"""The status document's `autostop` object before auto-stop has started: the API answers
before the part opens (node.assembly's order), so a node with an `autostop:` section says
`enabled`, `starting` in that window, never `off` (the dashboard and the monitor would show a
configured node as having none); a node without one says `off` before and after."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from config import load_settings
from health import BreakerConfig, BreakerRegistry
from node import NodeRuntime
from node.locks.service import LockService
from node.providers.own import AutostopPart


def _part(tmp_path: Path, autostop: dict[str, object] | None) -> AutostopPart:
    env = {"SHOAL_DATA_DIR": str(tmp_path)}
    settings = load_settings(env=env).settings
    if autostop is not None:
        settings = settings.model_copy(
            update={"autostop": type(settings).model_validate({"autostop": autostop}).autostop}
        )
    runtime = NodeRuntime(
        settings=settings,
        node_id="n1",
        address="127.0.0.1",
        version="1.0",
        breakers=BreakerRegistry(BreakerConfig()),
    )
    unused = cast(LockService, object())  # read only once auto-stop runs
    return AutostopPart(runtime, None, lambda: 0, unused, lambda why: None)


def test_a_configured_node_says_starting_until_its_auto_stop_runs(tmp_path: Path) -> None:
    part = _part(tmp_path, {"idle_minutes": 10})
    assert part.status() == {"enabled": True, "state": "starting", "last_decision": None}


def test_a_node_without_a_section_says_off(tmp_path: Path) -> None:
    part = _part(tmp_path, None)
    assert part.status() == {"enabled": False, "state": "off", "last_decision": None}
