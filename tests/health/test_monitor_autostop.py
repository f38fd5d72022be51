"""The monitor shows each node's auto-stop in one short column: off, idle against the window,
busy and why, stopping or stopped, dry run; the column appears only when a node has it on."""

from __future__ import annotations

from typing import Any

from health.monitor.model import AutostopInfo, parse_status
from health.monitor.render import autostop_text, render_text
from health.monitor.rules import build_cluster_status
from node.providers.autostop import starting_status
from tests.health.test_monitor_render import ok, seen

ON = {"enabled": True, "action": "stop", "window_s": 600.0, "dry_run": False}


def info(**fields: Any) -> AutostopInfo | None:
    return AutostopInfo.from_json({**ON, **fields})


def test_the_cell_says_the_state_in_a_few_words() -> None:
    assert autostop_text(None) == "-"
    assert autostop_text(AutostopInfo.from_json({"enabled": False, "state": "off"})) == "off"
    assert autostop_text(info(state="idle", idle_for_s=42.0)) == "idle 42 s/10 min"
    assert autostop_text(info(state="starting", idle_for_s=0.0)) == "starting"
    assert autostop_text(AutostopInfo.from_json(starting_status())) == "starting"
    busy = info(state="busy", busy_reasons=["job running", "gpu 0 at 83%"])
    assert autostop_text(busy) == "busy: job running +1"
    assert autostop_text(info(state="busy", busy_reasons=["gpu read failed"])) == (
        "busy: gpu read failed"
    )
    assert autostop_text(info(state="acting")) == "stopping"
    assert autostop_text(info(state="acted", action="release")) == "released"
    dry = info(state="idle", idle_for_s=3.0, dry_run=True)
    assert autostop_text(dry) == "idle 3.0 s/10 min (dry run)"


def test_a_status_without_autostop_or_with_wrong_types_never_fails() -> None:
    assert AutostopInfo.from_json(None) is None
    assert AutostopInfo.from_json("on") is None
    odd = AutostopInfo.from_json({"enabled": True, "idle_for_s": "x", "busy_reasons": 3})
    assert odd is not None
    assert odd.state == "?"
    assert odd.idle_for_s is None
    assert odd.busy_reasons == ()
    doc = parse_status({"node_id": "a", "autostop": {**ON, "state": "busy"}})
    assert doc.autostop is not None
    assert doc.autostop.state == "busy"


def test_the_dashboard_shows_a_column_only_when_a_node_has_autostop_on() -> None:
    seen_all = [seen(i) for i in range(3)]
    plain = build_cluster_status([ok(0), ok(1), ok(2)], seen_all, 1000.0)
    assert "autostop" not in render_text(plain, width=160)
    busy = {**ON, "state": "busy", "busy_reasons": ["job running"]}
    idle = {**ON, "state": "idle", "idle_for_s": 42.0}
    reports = [ok(0, autostop=busy), ok(1, autostop=idle), ok(2, autostop={"enabled": False})]
    status = build_cluster_status(reports, seen_all, 1000.0)
    row = status.node("gpu-a")
    assert row is not None
    assert row.to_dict()["autostop"]["busy_reasons"] == ["job running"]
    text = render_text(status, width=160)
    lines = text.splitlines()
    assert "autostop" in lines[1].split()
    cells = {line.split()[0]: line for line in lines if line.startswith("gpu-")}
    assert "busy: job running" in cells["gpu-a"]
    assert "idle 42 s/10 min" in cells["gpu-b"]
    assert " off " in cells["gpu-c"]
