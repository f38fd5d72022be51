"""Pure decisions of cluster_monitor: whose observation of a member counts, majorities and drift,
failures since the previous refresh, and the whole ClusterStatus from what the nodes said.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from health.monitor.model import (
    UNKNOWN_STATE,
    ClusterStatus,
    ClusterSummary,
    FailureEvent,
    NodeReport,
    NodeRow,
    NodeStatusDoc,
    Observation,
)

__all__ = [
    "MAX_MIXED_RELEASES",
    "build_cluster_status",
    "freshest_observation",
    "majority",
    "recent_failures",
    "release_warning",
    "releases_of",
]

_SEVERITY = {"alive": 0, "suspect": 1, "dead": 2, "left": 3, UNKNOWN_STATE: -1}
_ESCALATIONS = frozenset({"suspect", "died"})
_OUTAGE_STEPS = frozenset({"unreachable", "suspect"})
FAILURE_WINDOW_S = 300.0
MAX_FAILURES = 10
MAX_MIXED_RELEASES = 2
"""A node speaks the forms of its own release and the previous one: more releases than this in
one cluster means some pair of nodes may not understand each other."""


def freshest_observation(observations: Sequence[Observation]) -> Observation | None:
    """The observation heard most recently (smallest last_seen_s).

    A node's view of itself counts only when no other node observed it (its own view always
    says alive and just heard). Ties go to the higher incarnation, then the worse state.
    """
    others = [obs for obs in observations if not obs.is_self]
    pool = others or list(observations)
    if not pool:
        return None
    return min(pool, key=lambda o: (o.last_seen_s, -o.incarnation, -_SEVERITY.get(o.state, 0)))


def majority(values: Iterable[str | None]) -> tuple[str | None, bool]:
    """The most common non-None value and whether it is unique (False on a tie or no values)."""
    counts = Counter(value for value in values if value is not None)
    ranked = counts.most_common(2)
    if not ranked:
        return None, False
    if len(ranked) == 2 and ranked[0][1] == ranked[1][1]:
        return ranked[0][0], False
    return ranked[0][0], True


def _drifts(value: str | None, common: str | None, unique: bool, distinct: int) -> bool:
    """True when `value` differs from the majority, or there is no majority among >1 values."""
    if value is None or distinct < 2:
        return False
    return not unique or value != common


def releases_of(rows: Sequence[NodeRow]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Every release the rows name, in sorted order, each with the node ids running it."""
    nodes: dict[str, list[str]] = {}
    for row in rows:
        if row.version is not None:
            nodes.setdefault(row.version, []).append(row.node_id)
    return tuple((release, tuple(sorted(ids))) for release, ids in sorted(nodes.items()))


def release_warning(releases: Sequence[tuple[str, Sequence[str]]]) -> str | None:
    """The warning of a cluster mixing more than MAX_MIXED_RELEASES releases, else None."""
    if len(releases) <= MAX_MIXED_RELEASES:
        return None
    each = "; ".join(f"{release} on {', '.join(nodes)}" for release, nodes in releases)
    return (
        f"{len(releases)} releases mixed ({each}): a node speaks only its own release's and the "
        "previous one's forms; upgrade the oldest nodes first"
    )


def _row_id(report: NodeReport, by_endpoint: dict[tuple[str, int], str]) -> str:
    if report.status is not None:
        return report.status.node_id
    if report.expected_id is not None:
        return report.expected_id
    return by_endpoint.get((report.address, report.port), f"{report.address}:{report.port}")


def _coordinator(statuses: Sequence[NodeStatusDoc]) -> tuple[str | None, int | None]:
    terms = [doc.term for doc in statuses if doc.term is not None]
    if not terms:
        named, _ = majority(doc.coordinator for doc in statuses)
        return named, None
    term = max(terms)
    named, _ = majority(doc.coordinator for doc in statuses if doc.term == term)
    return named, term


def recent_failures(
    previous: ClusterStatus | None,
    rows: Sequence[NodeRow],
    now: float,
    window_s: float = FAILURE_WINDOW_S,
    limit: int = MAX_FAILURES,
) -> tuple[FailureEvent, ...]:
    """New failures since `previous` (died, suspect, unreachable, flapped), newest first, then
    the previous ones still within `window_s` (an outage's earlier steps replaced by its
    latest); at most `limit`."""
    if previous is None:
        return ()
    before = {row.node_id: row for row in previous.nodes}
    fresh: list[FailureEvent] = []
    for row in rows:
        old = before.get(row.node_id)
        if old is None or row.state == "left" or old.state == "left":
            continue  # leaving and coming back (with a higher incarnation) are no failures
        if row.state == "dead" and old.state != "dead":
            fresh.append(FailureEvent(row.node_id, "died", now, row.error or ""))
        elif row.state == "suspect" and old.state == "alive":
            fresh.append(FailureEvent(row.node_id, "suspect", now, row.error or ""))
        elif row.error is not None and old.error is None:
            fresh.append(FailureEvent(row.node_id, "unreachable", now, row.error))
        elif row.state == "alive" and (
            old.state in ("suspect", "dead") or (row.incarnation or 0) > (old.incarnation or 0) > 0
        ):
            detail = f"{old.state} -> alive, incarnation {old.incarnation} -> {row.incarnation}"
            fresh.append(FailureEvent(row.node_id, "flapped", now, detail))
    # One outage reads as one line: an escalation (unreachable -> suspect -> died) replaces
    # the earlier steps of the same node.
    escalated = {event.node_id for event in fresh if event.kind in _ESCALATIONS}
    kept = [
        event
        for event in previous.recent_failures
        if now - event.at <= window_s
        and not (event.node_id in escalated and event.kind in _OUTAGE_STEPS)
    ]
    return tuple((fresh + kept)[:limit])


def _make_row(
    node_id: str,
    report: NodeReport | None,
    seen: Observation | None,
    coordinator: str | None,
) -> NodeRow:
    doc = report.status if report is not None else None
    if report is not None:
        address, port = report.address, report.port
    elif seen is not None:
        address, port = seen.address, seen.port
    else:  # pragma: no cover - every row has a report or an observation
        address, port = "?", 0
    error = report.error if report is not None else "not asked"
    return NodeRow(
        node_id=node_id,
        address=address,
        port=port,
        state=seen.state if seen is not None else UNKNOWN_STATE,
        role=(doc.role if doc is not None else None) or (seen.role if seen else None),
        last_seen_s=round(seen.last_seen_s, 3) if seen is not None else None,
        incarnation=seen.incarnation if seen is not None else None,
        health=doc.health if doc is not None else None,
        term=doc.term if doc is not None else None,
        is_coordinator=coordinator is not None and node_id == coordinator,
        wal_pending=doc.wal_pending if doc is not None else None,
        wal_oldest_pending_age_s=doc.wal_oldest_pending_age_s if doc is not None else None,
        breakers_open=doc.breakers_open if doc is not None else (),
        gpus=doc.gpus if doc is not None else (),
        version=(doc.version if doc is not None else None) or (seen.version if seen else None),
        config_hash=doc.config_hash if doc is not None else None,
        version_drift=False,
        config_drift=False,
        error=None if doc is not None else error,
        health_problems=doc.health_problems if doc is not None else (),
        jobs_running=doc.jobs_running if doc is not None else None,
        autostop=doc.autostop if doc is not None else None,
        protocol=(doc.protocol if doc is not None else None) or (seen.protocol if seen else None),
        refused=seen.refused if seen is not None else None,
        drain=doc.drain if doc is not None else None,
        training=doc.training if doc is not None else None,
    )


def _summary(rows: Sequence[NodeRow], statuses: Sequence[NodeStatusDoc]) -> ClusterSummary:
    states = Counter(row.state for row in rows)
    health = Counter(row.health for row in rows if row.error is None)
    version, _ = majority(row.version for row in rows)
    config_hash, _ = majority(row.config_hash for row in rows)
    cluster, _ = majority(doc.cluster for doc in statuses)
    releases = releases_of(rows)
    return ClusterSummary(
        cluster=cluster,
        nodes_total=len(rows),
        nodes_alive=states["alive"],
        nodes_suspect=states["suspect"],
        nodes_dead=states["dead"],
        nodes_left=states["left"],
        nodes_unknown=states[UNKNOWN_STATE],
        nodes_unreachable=sum(1 for row in rows if row.error is not None),
        nodes_healthy=health["healthy"],
        nodes_degraded=health["degraded"],
        nodes_unhealthy=health["unhealthy"],
        gpus_total=sum(len(row.gpus) for row in rows),
        gpus_faulty=sum(1 for row in rows for gpu in row.gpus if gpu.faults),
        wal_pending_total=sum(row.wal_pending or 0 for row in rows),
        breakers_open_total=sum(len(row.breakers_open) for row in rows),
        version_majority=version,
        config_hash_majority=config_hash,
        drifted=tuple(row.node_id for row in rows if row.version_drift or row.config_drift),
        releases=releases,
        release_warning=release_warning(releases),
    )


def build_cluster_status(
    reports: Sequence[NodeReport],
    views: Sequence[Observation],
    now: float,
    previous: ClusterStatus | None = None,
) -> ClusterStatus:
    """One row per node that was asked or that any view mentions, sorted by node id.

    State and last_seen_s come from the freshest observation in `views`; everything else from
    the node's own status. Version and config hash are compared against the majority.
    """
    by_endpoint = {(obs.address, obs.port): obs.node_id for obs in views}
    by_id: dict[str, NodeReport] = {}
    for report in reports:
        node_id = _row_id(report, by_endpoint)
        kept = by_id.get(node_id)
        if kept is None or (kept.status is None and report.status is not None):
            by_id[node_id] = report
    observed: dict[str, list[Observation]] = {}
    for obs in views:
        observed.setdefault(obs.node_id, []).append(obs)
    statuses = [r.status for r in by_id.values() if r.status is not None]
    coordinator, term = _coordinator(statuses)
    rows = [
        _make_row(node_id, by_id.get(node_id), freshest_observation(observed.get(node_id, [])),
                  coordinator)
        for node_id in sorted(set(by_id) | set(observed))
    ]  # fmt: skip
    version, version_unique = majority(row.version for row in rows)
    config_hash, config_unique = majority(row.config_hash for row in rows)
    versions = len({row.version for row in rows if row.version is not None})
    hashes = len({row.config_hash for row in rows if row.config_hash is not None})
    rows = [
        _with_drift(
            row,
            _drifts(row.version, version, version_unique, versions),
            _drifts(row.config_hash, config_hash, config_unique, hashes),
        )
        for row in rows
    ]
    return ClusterStatus(
        time=now,
        coordinator=coordinator,
        term=term,
        nodes=tuple(rows),
        summary=_summary(rows, statuses),
        recent_failures=recent_failures(previous, rows, now),
    )


def _with_drift(row: NodeRow, version_drift: bool, config_drift: bool) -> NodeRow:
    if not (version_drift or config_drift):
        return row
    return replace(row, version_drift=version_drift, config_drift=config_drift)
