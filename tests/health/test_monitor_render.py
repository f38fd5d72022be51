"""The dashboard is a pure function of a ClusterStatus: rendered at 120 and 80 columns."""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import pytest
from rich.console import Console

from health.monitor.model import ClusterStatus, NodeReport, Observation, parse_status
from health.monitor.render import (
    AMBER,
    RED,
    breakers_text,
    format_duration,
    gpu_text,
    render_dashboard,
    render_text,
    seen_style,
)
from health.monitor.rules import build_cluster_status

NAMES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")


def gpu(index: int, util: float, used_mb: float, temp: float, **extra: Any) -> dict[str, Any]:
    return {
        "index": index, "name": "H100", "uuid": f"GPU-{index}", "util_pct": util,
        "memory_used_mb": used_mb, "memory_total_mb": 81920, "temperature_c": temp,
        "ecc_uncorrected": 0, "remapped_pending": False, "remapped_failed": False,
        "xid_errors": 0, "error": False, **extra,
    }  # fmt: skip


def status_doc(node_id: str, **extra: Any) -> dict[str, Any]:
    base = {
        "node_id": node_id, "cluster": "lab", "version": "0.1.0", "role": "training",
        "term": 7, "coordinator": "gpu-a", "health": "healthy",
        "wal": {"pending": 0, "oldest_pending_age_s": None}, "breakers": {"open": []},
        "gpus": [gpu(0, 86, 61440, 71), gpu(1, 90, 62464, 74)], "config_hash": "a1b2c3d4e5f6",
    }  # fmt: skip
    return {**base, **extra}


def ok(index: int, **extra: Any) -> NodeReport:
    address = f"10.0.0.{index + 1}"
    parsed = parse_status(status_doc(NAMES[index], **extra))
    return NodeReport(f"http://{address}:8770", address, 8770, NAMES[index], parsed, None)


def seen(index: int, state: str = "alive", last_s: float = 0.2) -> Observation:
    return Observation(NAMES[index], f"10.0.0.{index + 1}", 8770, state, 1, last_s, False)


def healthy_cluster() -> ClusterStatus:
    return build_cluster_status([ok(i) for i in range(3)], [seen(i) for i in range(3)], 1000.0)


def troubled_cluster() -> ClusterStatus:
    """gpu-d died (unreachable), gpu-b has open breakers, a WAL backlog, an ECC fault and runs
    another version; gpu-c was last heard long ago."""
    before = build_cluster_status([ok(i) for i in range(4)], [seen(i) for i in range(4)], 1000.0)
    gone = NodeReport("http://10.0.0.4:8770", "10.0.0.4", 8770, "gpu-d", None,
                      "unreachable: connection refused")  # fmt: skip
    busy = ok(
        1,
        health="degraded",
        version="0.2.0",
        wal={"pending": 12, "oldest_pending_age_s": 34.0},
        breakers={"open": ["gpu-b/http", "gpu-c/rsync"]},
        gpus=[gpu(0, 10, 1024, 80, ecc_uncorrected=2)],
    )
    views = [seen(0), seen(1), seen(2, last_s=1.7), seen(3, "dead", 6.0)]
    return build_cluster_status([ok(0), busy, ok(2), gone], views, 1004.0, before)


def recorded(status: ClusterStatus, width: int) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True)
    console.print(render_dashboard(status, probe_interval_s=0.5, width=width))
    return console.export_text()


@pytest.mark.parametrize("width", [120, 80])
def test_healthy_cluster(width: int) -> None:
    text = recorded(healthy_cluster(), width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "OK" in lines[0]
    assert "shoal cluster lab" in lines[0]
    for name in NAMES[:3]:
        assert sum(1 for line in lines if line.startswith(name)) == 1
    assert "gpu-a *" in text  # the coordinator
    assert "2x 88% 121/160G 74C" in text
    assert "nodes 3/3 alive | GPUs 6 | pending ops 0 | breakers open 0" in text
    assert "coordinator gpu-a (*), term 7 | version 0.1.0 | config a1b2c3d4e5f6" in text
    assert "recent failures: none" in text
    assert "drift" not in text
    assert "\x1b" not in text


def test_dead_node_and_open_breakers_at_120() -> None:
    text = recorded(troubled_cluster(), 120)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert "2 of 4 nodes need attention" in lines[0]
    header = lines[1].split()
    assert header == ["node", "address", "role", "state", "seen", "term", "health", "gpus",
                      "jobs", "wal", "breakers", "version"]  # fmt: skip
    row_d = next(line for line in lines if line.startswith("gpu-d"))
    assert "10.0.0.4:8770" in row_d
    assert "dead" in row_d
    assert "6.0 s" in row_d
    assert "unreachable:" in row_d
    assert "connection refused" in " ".join(" ".join(lines[lines.index(row_d) :][:3]).split())
    row_b = next(line for line in lines if line.startswith("gpu-b"))
    assert "degraded" in row_b
    assert "12 (34 s)" in row_b
    assert "0.2.0 drift" in row_b
    assert "2 open:" in row_b
    block_b = " ".join(lines[lines.index(row_b) :][:3])
    assert "gpu-b/http," in block_b
    assert "gpu-c/rsync" in block_b
    assert "!ECC" in block_b
    assert "nodes 3/4 alive (1 dead, 1 unreachable) | GPUs 5 (1 faulty)" in text
    assert "pending ops 12 | breakers open 2" in text
    assert "drift (!): gpu-b" in text
    assert "recent failures:" in text
    assert "gpu-d died 0.0 s ago (unreachable: connection refused)" in text


def test_dead_node_and_open_breakers_at_80() -> None:
    text = recorded(troubled_cluster(), 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[1].split() == ["node", "state", "seen", "health", "gpus", "wal", "breakers"]
    assert "10.0.0.4" not in text  # no address column when narrow
    assert any(line.startswith("gpu-b !") for line in lines)  # drift marker on the name
    row_d = next(line for line in lines if line.startswith("gpu-d"))
    assert "dead" in row_d
    assert "unreachable:" in row_d
    assert "gpu-d died" in text


def test_plain_text_has_no_escape_codes() -> None:
    text = render_text(troubled_cluster(), width=100)
    assert "\x1b" not in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_seen_is_amber_past_two_probe_intervals_and_red_when_suspect_or_dead() -> None:
    status = troubled_cluster()
    rows = {row.node_id: row for row in status.nodes}
    assert seen_style(rows["gpu-a"], 0.5) == ""
    assert seen_style(rows["gpu-c"], 0.5) == AMBER
    assert seen_style(rows["gpu-d"], 0.5) == RED
    assert seen_style(replace(rows["gpu-a"], state="suspect"), 0.5) == RED


def test_cell_texts() -> None:
    rows = {row.node_id: row for row in troubled_cluster().nodes}
    assert breakers_text(rows["gpu-b"]) == "2 open: gpu-b/http, gpu-c/rsync"
    assert breakers_text(rows["gpu-a"]) == "-"
    assert gpu_text(rows["gpu-b"].gpus) == "1x 10% 1/80G 80C !ECC"
    assert gpu_text(()) == "-"
    assert [format_duration(s) for s in (0.25, 42, 720, 9000)] == ["0.2 s", "42 s", "12 min",
                                                                   "2.5 h"]  # fmt: skip


def test_a_failing_loop_shows_its_last_error_in_the_health_cell() -> None:
    problem = "sync: sync loop failed 3 rounds in a row; last error 2 s ago: gpu-c: refused"
    failing = ok(1, health="degraded", health_problems=[problem])
    status = build_cluster_status([ok(0), failing], [seen(0), seen(1)], 1000.0)
    (row,) = [r for r in status.nodes if r.node_id == "gpu-b"]
    assert row.health_problems == (problem,)
    assert row.to_dict()["health_problems"] == [problem]
    text = " ".join(recorded(status, 200).split())
    assert f"degraded: {problem}" in text
    assert "healthy:" not in text  # a healthy node shows no problem text


def test_each_node_shows_its_running_jobs_count() -> None:
    reports = [ok(0, jobs={"running": 3, "succeeded": 9}), ok(1, jobs={"running": 0}), ok(2)]
    status = build_cluster_status(reports, [seen(i) for i in range(3)], 1000.0)
    assert status.node("gpu-a") is not None
    assert status.node("gpu-a").to_dict()["jobs_running"] == 3  # type: ignore[union-attr]
    lines = recorded(status, 140).splitlines()
    at = lines[1].index(" jobs ") + 1
    rows = [line for line in lines if line.startswith("gpu-")]
    cells = {line.split()[0]: line[at : at + 4].strip() for line in rows}
    assert cells == {"gpu-a": "3", "gpu-b": "0", "gpu-c": "-"}


def test_a_draining_node_shows_in_a_drain_column_only_while_one_drains() -> None:
    assert "drain" not in recorded(healthy_cluster(), 140).splitlines()[1]
    reports = [ok(0, drain={"kill_after_s": 60}), ok(1, drain={"kill_after_s": None}), ok(2)]
    status = build_cluster_status(reports, [seen(i) for i in range(3)], 1000.0)
    rows = {row.node_id: row for row in status.nodes}
    assert rows["gpu-a"].to_dict()["drain"] == {"kill_after_s": 60.0}
    assert rows["gpu-b"].to_dict()["drain"] == {"kill_after_s": None}
    assert rows["gpu-c"].to_dict()["drain"] is None
    assert parse_status(status_doc("gpu-x", drain="junk")).drain is None
    for width in (140, 80):
        lines = recorded(status, width).splitlines()
        assert " drain " in lines[1]
        assert max(len(line) for line in lines) <= width
        cells = {line.split()[0]: line for line in lines if line.startswith("gpu-")}
        assert "draining, kill 60s" in cells["gpu-a"]
        assert "draining" in cells["gpu-b"]
        assert "draining" not in cells["gpu-c"]


def test_a_quarantined_node_shows_its_gpu_fault_in_the_drain_column() -> None:
    fault = {"reason": "gpu_fault: Xid 79 on GPU-5d8f0e1c-2a", "state": "settling"}
    reports = [ok(0, quarantine=fault), ok(1, drain={"kill_after_s": None}, quarantine=fault)]
    status = build_cluster_status([*reports, ok(2)], [seen(i) for i in range(3)], 1000.0)
    rows = {row.node_id: row for row in status.nodes}
    assert rows["gpu-a"].to_dict()["drain"] == {"draining": False, "quarantine": fault["reason"]}
    assert rows["gpu-b"].to_dict()["drain"] == {
        "kill_after_s": None,
        "quarantine": fault["reason"],
    }
    assert parse_status(status_doc("gpu-x", quarantine={"state": "x"})).drain is None
    lines = recorded(status, 160).splitlines()
    cells = {line.split()[0]: line for line in lines if line.startswith("gpu-")}
    assert "quarantined: Xid 79 on GPU-5d8f0e1c-2a" in cells["gpu-a"]
    assert "draining" not in cells["gpu-a"]
    assert "draining; quarantined: Xid 79" in cells["gpu-b"]


def test_each_training_node_shows_its_step_and_rate_only_while_one_trains() -> None:
    assert "training" not in recorded(healthy_cluster(), 160).splitlines()[1]
    progress = {"generation": 4, "ranks": 2, "step": 1234, "steps_per_s": 5.2}
    reports = [ok(0, training=progress), ok(1, training=None), ok(2, training={"step": "x"})]
    status = build_cluster_status(reports, [seen(i) for i in range(3)], 1000.0)
    rows = {row.node_id: row for row in status.nodes}
    assert rows["gpu-a"].to_dict()["training"] == progress
    assert rows["gpu-b"].to_dict()["training"] is None
    assert rows["gpu-c"].training is None, "junk reads as nothing"
    for width in (160, 80):
        lines = recorded(status, width).splitlines()
        assert " training " in lines[1]
        assert max(len(line) for line in lines) <= width
        cells = {line.split()[0]: line for line in lines if line.startswith("gpu-")}
        assert "step 1234, 5.20/s" in cells["gpu-a"]
        assert "step" not in cells["gpu-b"]


def test_a_node_its_peers_refuse_shows_dead_refused() -> None:
    why = "revoked: the certificate of 'gpu-c' (serial 5F) was revoked at ... (CRL number 2)"
    views = [seen(0), seen(1), replace(seen(2, "dead", 4.0), refused=why)]
    status = build_cluster_status([ok(0), ok(1), ok(2)], views, 1000.0)
    row = status.node("gpu-c")
    assert row is not None
    assert row.failing
    assert row.to_dict()["refused"] == why
    cells = {
        line.split()[0]: line for line in recorded(status, 140).splitlines() if line[:4] == "gpu-"
    }
    assert "dead (refused)" in cells["gpu-c"]
    assert "refused" not in cells["gpu-a"]
