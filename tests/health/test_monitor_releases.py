"""cluster_monitor and mixed releases: each node's release and protocol, the releases of the
cluster with their nodes, and a warning (text and --json) when more than two are mixed."""

from __future__ import annotations

from typing import Any

from health.monitor.model import NodeReport, Observation, parse_peers, parse_status
from health.monitor.render import render_text
from health.monitor.rules import MAX_MIXED_RELEASES, build_cluster_status, release_warning
from tests.health.test_monitor_rules import doc


def _cluster(releases: dict[str, str | None], protocols: dict[str, int | None]) -> Any:
    reports, views = [], []
    for port, (node, release) in enumerate(sorted(releases.items()), start=8770):
        extra: dict[str, Any] = {"version": release}
        if protocols.get(node) is not None:
            extra["protocol"] = protocols[node]
        status = parse_status(doc(node, **extra))
        reports.append(NodeReport(f"http://10.0.0.1:{port}", "10.0.0.1", port, node, status, None))
        views.append(Observation(node, "10.0.0.1", port, "alive", 1, 0.1, False))
    return build_cluster_status(reports, views, 100.0)


def test_two_releases_are_listed_without_a_warning() -> None:
    status = _cluster({"a": "0.1.0", "b": "0.1.0", "c": "0.2.0"}, {"c": 2})
    assert status.summary.releases == (("0.1.0", ("a", "b")), ("0.2.0", ("c",)))
    assert status.summary.release_warning is None
    data = status.to_dict()
    assert data["summary"]["releases"] == {"0.1.0": ["a", "b"], "0.2.0": ["c"]}
    assert data["summary"]["release_warning"] is None
    rows = {row["node_id"]: row for row in data["nodes"]}
    assert (rows["a"]["release"], rows["a"]["protocol"]) == ("0.1.0", None)
    assert (rows["c"]["release"], rows["c"]["protocol"]) == ("0.2.0", 2)
    text = render_text(status, width=160)
    assert "releases 0.1.0 x2, 0.2.0 x1" in text
    assert "releases mixed" not in text


def test_more_than_two_releases_warn_in_text_and_json() -> None:
    releases = {"a": "0.1.0", "b": "0.2.0", "c": "0.3.0", "d": "0.3.0", "e": None}
    status = _cluster(releases, {})
    warning = status.summary.release_warning
    assert warning is not None
    assert warning.startswith("3 releases mixed (0.1.0 on a; 0.2.0 on b; 0.3.0 on c, d)")
    assert status.to_dict()["summary"]["release_warning"] == warning
    assert status.ok, "mixed releases warn; they are not a failing node"
    text = render_text(status, width=400)
    assert f"(!) {warning}" in text


def test_the_warning_starts_above_two() -> None:
    assert MAX_MIXED_RELEASES == 2
    assert release_warning([("1", ("a",)), ("2", ("b",))]) is None
    assert release_warning([("1", ("a",)), ("2", ("b",)), ("3", ("c",))]) is not None


def test_a_view_gives_the_protocol_of_a_node_that_did_not_answer() -> None:
    (member,) = parse_peers(
        {
            "members": [
                {"node_id": "x", "address": "10.0.0.2", "port": 1, "last_seen_s": 0.2,
                 "state": "alive", "version": "0.2.0", "protocol": 2}
            ]
        }
    )  # fmt: skip
    assert (member.version, member.protocol) == ("0.2.0", 2)
    unreachable = NodeReport("http://10.0.0.2:1", "10.0.0.2", 1, "x", None, "refused")
    status = build_cluster_status([unreachable], [member], 100.0)
    assert (status.nodes[0].version, status.nodes[0].protocol) == ("0.2.0", 2)
