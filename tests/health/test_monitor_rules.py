"""cluster_monitor's pure parts: parsing what nodes say, merging views, drift, failures, exits."""

from __future__ import annotations

from typing import Any

import pytest

from health import GpuInfo
from health.errors import MonitorError, describe_fetch_error
from health.monitor.client import normalize_node_url
from health.monitor.model import NodeReport, Observation, parse_peers, parse_status
from health.monitor.rules import build_cluster_status, freshest_observation, majority

NODE_KEYS = {
    "node_id", "address", "port", "state", "role", "last_seen_s", "health", "wal_pending",
    "wal_oldest_pending_age_s", "breakers_open", "gpus", "version", "error",
}  # fmt: skip


def doc(node_id: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "node_id": node_id,
        "cluster": "lab",
        "version": "0.1.0",
        "role": "training",
        "term": None,
        "coordinator": None,
        "health": "healthy",
        "wal": {"pending": 0, "oldest_pending_age_s": None},
        "breakers": {"open": [], "details": []},
        "gpus": [],
        "config_hash": "aaaa",
    }
    return {**base, **extra}


def report(node_id: str, port: int, error: str | None = None, **extra: Any) -> NodeReport:
    status = None if error else parse_status(doc(node_id, **extra))
    return NodeReport(f"http://10.0.0.1:{port}", "10.0.0.1", port, node_id, status, error)


def seen(
    node_id: str, port: int, state: str = "alive", last_s: float = 0.1, **kw: Any
) -> Observation:
    return Observation(node_id, "10.0.0.1", port, state, kw.pop("incarnation", 1), last_s,
                       kw.pop("is_self", False), **kw)  # fmt: skip


def cluster(*rows: tuple[NodeReport, Observation], now: float = 100.0, previous: Any = None) -> Any:
    return build_cluster_status([r for r, _ in rows], [o for _, o in rows], now, previous)


def test_parse_status_reads_the_document_and_tolerates_junk() -> None:
    parsed = parse_status(
        doc(
            "a",
            wal={"pending": 3, "oldest_pending_age_s": 4.5},
            breakers={"open": ["b/http", "c/rsync"]},
            gpus=[{"index": 0, "util_pct": 50, "ecc_uncorrected": 2}, "junk"],
            term="seven",
        )
    )
    assert (parsed.wal_pending, parsed.wal_oldest_pending_age_s) == (3, 4.5)
    assert parsed.breakers_open == ("b/http", "c/rsync")
    assert parsed.term is None
    assert len(parsed.gpus) == 1
    assert parsed.gpus[0].faults == ("ecc",)
    assert parse_status({"node_id": "x", "wal": None, "gpus": None}).gpus == ()
    with pytest.raises(ValueError, match="no node_id"):
        parse_status(["not", "a", "doc"])


def test_gpu_faults_name_ecc_remap_xid_and_unreadable() -> None:
    assert GpuInfo.from_json({"remapped_pending": True, "xid_errors": 3}).faults == ("remap", "xid")
    assert GpuInfo.from_json({"error": True}).faults == ("error",)
    assert GpuInfo.from_json({"ecc_uncorrected": 0, "remapped_failed": False}).faults == ()


def test_parse_peers_skips_bad_members() -> None:
    members = [
        {"node_id": "a", "address": "h", "port": 1, "state": "alive", "last_seen_s": 0.5,
         "incarnation": 2, "is_self": True, "version": "0.1.0"},
        {"node_id": "b", "address": "h", "port": "x", "state": "alive", "last_seen_s": 0.5},
        {"node_id": "c", "address": "h", "port": 3, "state": "weird", "last_seen_s": 1},
        "junk",
    ]  # fmt: skip
    found = parse_peers({"members": members})
    assert [(o.node_id, o.state, o.is_self) for o in found] == [
        ("a", "alive", True),
        ("c", "unknown", False),
    ]
    with pytest.raises(ValueError, match="members"):
        parse_peers({"nodes": []})


def test_freshest_observation_prefers_other_viewers_and_recent_news() -> None:
    own = seen("a", 1, last_s=0.0, is_self=True)
    stale = seen("a", 1, "suspect", last_s=2.0)
    fresh = seen("a", 1, "alive", last_s=0.3)
    assert freshest_observation([own, stale, fresh]) == fresh
    assert freshest_observation([own, stale]) == stale
    assert freshest_observation([own]) == own
    assert freshest_observation([]) is None
    dead = seen("a", 1, "dead", last_s=2.0)
    assert freshest_observation([stale, dead]) == dead  # a tie goes to the worse state


def test_majority_and_ties() -> None:
    assert majority(["1", "1", "2", None]) == ("1", True)
    assert majority(["1", "2"])[1] is False
    assert majority([None]) == (None, False)


def test_healthy_cluster_is_ok_and_every_node_is_a_row() -> None:
    status = cluster((report("a", 1), seen("a", 1)), (report("b", 2), seen("b", 2)))
    assert [row.node_id for row in status.nodes] == ["a", "b"]
    assert status.ok
    assert status.exit_code == 0
    data = status.to_dict()
    assert set(data) == {"time", "coordinator", "term", "nodes", "summary"}
    assert all(set(node) >= NODE_KEYS for node in data["nodes"])
    assert data["summary"]["nodes_alive"] == 2
    assert data["summary"]["ok"] is True


@pytest.mark.parametrize(
    ("state", "health", "error"),
    [
        ("alive", "degraded", None),
        ("alive", "unhealthy", None),
        ("suspect", "healthy", None),
        ("dead", None, "unreachable: connection refused"),
        ("alive", None, "timeout after 3.0 s"),
    ],
)
def test_any_unwell_node_makes_exit_1(state: str, health: str | None, error: str | None) -> None:
    sick = report("b", 2, error=error, health=health)
    status = cluster((report("a", 1), seen("a", 1)), (sick, seen("b", 2, state)))
    assert status.exit_code == 1
    assert status.node("b") is not None
    assert status.node("b").error == error  # type: ignore[union-attr]


def test_a_node_that_left_is_not_a_failure() -> None:
    gone = report("b", 2, error="unreachable: connection refused")
    status = cluster((report("a", 1), seen("a", 1)), (gone, seen("b", 2, "left")))
    assert status.ok
    assert status.summary.nodes_left == 1


def test_a_node_that_left_and_rejoins_is_no_failure_event() -> None:
    first = cluster((report("a", 1), seen("a", 1)), (report("b", 2), seen("b", 2, incarnation=1)))
    gone = report("b", 2, error="unreachable: connection refused")
    left = cluster(
        (report("a", 1), seen("a", 1)), (gone, seen("b", 2, "left")), now=101.0, previous=first
    )
    assert left.ok
    assert left.recent_failures == ()
    back = cluster(
        (report("a", 1), seen("a", 1)),
        (report("b", 2), seen("b", 2, incarnation=2)),
        now=102.0,
        previous=left,
    )
    assert back.recent_failures == ()


def test_unknown_seed_takes_its_id_from_the_views() -> None:
    anonymous = NodeReport("http://10.0.0.1:2", "10.0.0.1", 2, None, None, "timeout after 1.0 s")
    status = build_cluster_status([report("a", 1), anonymous], [seen("a", 1), seen("b", 2)], 1.0)
    assert [row.node_id for row in status.nodes] == ["a", "b"]
    lonely = NodeReport("http://10.0.0.9:9", "10.0.0.9", 9, None, None, "unreachable: x")
    alone = build_cluster_status([lonely], [], 1.0)
    assert alone.nodes[0].node_id == "10.0.0.9:9"
    assert alone.nodes[0].state == "unknown"
    assert alone.exit_code == 1


def test_version_and_config_drift_against_the_majority() -> None:
    status = cluster(
        (report("a", 1), seen("a", 1)),
        (report("b", 2), seen("b", 2)),
        (report("c", 3, version="0.2.0", config_hash="bbbb"), seen("c", 3)),
    )
    drift = {row.node_id: (row.version_drift, row.config_drift) for row in status.nodes}
    assert drift == {"a": (False, False), "b": (False, False), "c": (True, True)}
    assert status.summary.drifted == ("c",)
    assert status.summary.version_majority == "0.1.0"
    tie = cluster((report("a", 1), seen("a", 1)), (report("b", 2, version="9"), seen("b", 2)))
    assert all(row.version_drift for row in tie.nodes)


def test_coordinator_is_named_by_the_highest_term() -> None:
    status = cluster(
        (report("a", 1, term=3, coordinator="a"), seen("a", 1)),
        (report("b", 2, term=4, coordinator="b"), seen("b", 2)),
        (report("c", 3, term=4, coordinator="b"), seen("c", 3)),
    )
    assert (status.coordinator, status.term) == ("b", 4)
    assert [row.node_id for row in status.nodes if row.is_coordinator] == ["b"]


def test_recent_failures_since_the_previous_refresh() -> None:
    first = cluster(
        (report("a", 1), seen("a", 1)),
        (report("b", 2), seen("b", 2)),
        (report("c", 3), seen("c", 3, incarnation=1)),
        (report("d", 4), seen("d", 4)),
        now=100.0,
    )
    assert first.recent_failures == ()
    second = cluster(
        (report("a", 1), seen("a", 1)),
        (report("b", 2, error="unreachable: connection refused"), seen("b", 2, "dead")),
        (report("c", 3), seen("c", 3, incarnation=2)),
        (report("d", 4, error="timeout after 3.0 s"), seen("d", 4)),
        now=102.0,
        previous=first,
    )
    kinds = {event.node_id: event.kind for event in second.recent_failures}
    assert kinds == {"b": "died", "c": "flapped", "d": "unreachable"}
    third = cluster(
        (report("a", 1), seen("a", 1)),
        (report("c", 3), seen("c", 3, incarnation=2)),
        now=150.0,
        previous=second,
    )
    assert {event.node_id for event in third.recent_failures} == {"b", "c", "d"}
    much_later = cluster((report("a", 1), seen("a", 1)), now=1000.0, previous=third)
    assert much_later.recent_failures == ()


def test_fetch_errors_read_as_one_line() -> None:
    assert describe_fetch_error(TimeoutError(), 3) == "timeout after 3.0 s"
    assert describe_fetch_error(ConnectionResetError("reset by peer"), 3) == (
        "unreachable: reset by peer"
    )


def test_node_urls_are_normalized() -> None:
    assert normalize_node_url("127.0.0.1:8770") == "http://127.0.0.1:8770"
    assert normalize_node_url("http://[::1]:9/") == "http://[::1]:9"
    for bad in ("ftp://x", "http://h/x", "", "http://:80"):
        with pytest.raises(MonitorError, match="not a node URL"):
            normalize_node_url(bad)


def test_an_outage_reads_as_one_failure_line() -> None:
    steps = [("alive", None), ("alive", "timeout after 3.0 s"), ("suspect", "timeout after 3.0 s"),
             ("dead", "timeout after 3.0 s")]  # fmt: skip
    status = None
    for now, (state, error) in enumerate(steps):
        status = cluster(
            (report("a", 1), seen("a", 1)),
            (report("b", 2, error=error), seen("b", 2, state)),
            now=float(now),
            previous=status,
        )
        assert status.recent_failures == () or len(status.recent_failures) == 1
    assert status is not None
    assert [(e.node_id, e.kind, e.at) for e in status.recent_failures] == [("b", "died", 3.0)]
