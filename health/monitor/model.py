"""Plain data of cluster_monitor: what nodes said (status, membership views), one row per node,
and the whole cluster; parsers from the JSON of /v1/status and /v1/peers that never trust it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from health.errors import HealthError

__all__ = [
    "ClusterStatus",
    "ClusterSummary",
    "FailureEvent",
    "GpuReading",
    "MonitorError",
    "NodeReport",
    "NodeRow",
    "NodeStatusDoc",
    "Observation",
    "parse_gpu",
    "parse_peers",
    "parse_status",
]

MEMBER_STATES = ("alive", "suspect", "dead", "left")
UNKNOWN_STATE = "unknown"
"""State of a node no fetched membership view mentions."""


class MonitorError(HealthError):
    """cluster_monitor could not do what was asked (bad targets, a closed monitor)."""


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class GpuReading:
    """One GPU as its node reports it; None where the node could not read a value."""

    index: int
    name: str
    uuid: str
    util_pct: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    temperature_c: float | None
    ecc_uncorrected: int | None
    remapped_pending: bool | None
    remapped_failed: bool | None
    xid_errors: int | None
    error: bool

    @property
    def faults(self) -> tuple[str, ...]:
        """Short names of the hardware faults: ecc, remap, xid, error (unreadable or flagged)."""
        found = []
        if self.ecc_uncorrected:
            found.append("ecc")
        if self.remapped_pending or self.remapped_failed:
            found.append("remap")
        if self.xid_errors:
            found.append("xid")
        if self.error and not found:
            found.append("error")
        return tuple(found)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_gpu(data: Mapping[str, Any], position: int = 0) -> GpuReading:
    """A GpuReading from one entry of the status document's `gpus`; bad fields become None."""
    index = _int(data.get("index"))
    return GpuReading(
        index=position if index is None else index,
        name=_str(data.get("name")) or "?",
        uuid=_str(data.get("uuid")) or "",
        util_pct=_float(data.get("util_pct")),
        memory_used_mb=_float(data.get("memory_used_mb")),
        memory_total_mb=_float(data.get("memory_total_mb")),
        temperature_c=_float(data.get("temperature_c")),
        ecc_uncorrected=_int(data.get("ecc_uncorrected")),
        remapped_pending=_bool(data.get("remapped_pending")),
        remapped_failed=_bool(data.get("remapped_failed")),
        xid_errors=_int(data.get("xid_errors")),
        error=bool(data.get("error")),
    )


@dataclass(frozen=True)
class NodeStatusDoc:
    """The parts of one node's /v1/status the monitor shows."""

    node_id: str
    cluster: str | None
    version: str | None
    address: str | None
    port: int | None
    role: str | None
    term: int | None
    coordinator: str | None
    health: str | None
    wal_pending: int | None
    wal_oldest_pending_age_s: float | None
    breakers_open: tuple[str, ...]
    gpus: tuple[GpuReading, ...]
    config_hash: str | None
    jobs_running: int | None = None


def parse_status(doc: Any) -> NodeStatusDoc:
    """A NodeStatusDoc from a /v1/status body; ValueError when it is not one."""
    if not isinstance(doc, Mapping) or not _str(doc.get("node_id")):
        raise ValueError("not a status document (no node_id)")
    wal = _mapping(doc.get("wal"))
    breakers = _mapping(doc.get("breakers"))
    opened = _list(breakers.get("open"))
    gpus = [gpu for gpu in _list(doc.get("gpus")) if isinstance(gpu, Mapping)]
    return NodeStatusDoc(
        node_id=str(doc["node_id"]),
        cluster=_str(doc.get("cluster")),
        version=_str(doc.get("version")),
        address=_str(doc.get("address")),
        port=_int(doc.get("port")),
        role=_str(doc.get("role")),
        term=_int(doc.get("term")),
        coordinator=_str(doc.get("coordinator")),
        health=_str(doc.get("health")),
        wal_pending=_int(wal.get("pending")),
        wal_oldest_pending_age_s=_float(wal.get("oldest_pending_age_s")),
        breakers_open=tuple(str(name) for name in opened),
        gpus=tuple(parse_gpu(gpu, position) for position, gpu in enumerate(gpus)),
        config_hash=_str(doc.get("config_hash")),
        jobs_running=_int(_mapping(doc.get("jobs")).get("running")),
    )


@dataclass(frozen=True)
class Observation:
    """One member as one node's membership view (/v1/peers) shows it."""

    node_id: str
    address: str
    port: int
    state: str
    incarnation: int
    last_seen_s: float
    is_self: bool
    role: str | None = None
    version: str | None = None


def parse_peers(doc: Any) -> tuple[Observation, ...]:
    """The members of a /v1/peers body; ValueError when it is not one. Bad members are skipped."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("members"), list):
        raise ValueError("not a peers document (no members list)")
    found = []
    for member in doc["members"]:
        if not isinstance(member, Mapping):
            continue
        node_id, address = _str(member.get("node_id")), _str(member.get("address"))
        port, seen = _int(member.get("port")), _float(member.get("last_seen_s"))
        state = member.get("state")
        if node_id is None or address is None or port is None or seen is None:
            continue
        found.append(
            Observation(
                node_id=node_id,
                address=address,
                port=port,
                state=state if state in MEMBER_STATES else UNKNOWN_STATE,
                incarnation=_int(member.get("incarnation")) or 0,
                last_seen_s=max(0.0, seen),
                is_self=bool(member.get("is_self")),
                role=_str(member.get("role")),
                version=_str(member.get("version")),
            )
        )
    return tuple(found)


@dataclass(frozen=True)
class NodeReport:
    """What asking one node's /v1/status gave: the document, or why there is none.

    `expected_id` is the node id known before asking (from a view or the inventory).
    """

    url: str
    address: str
    port: int
    expected_id: str | None
    status: NodeStatusDoc | None
    error: str | None


@dataclass(frozen=True)
class NodeRow:
    """One node of the dashboard: state and last_seen_s from the peers' views, the rest from
    the node's own status; `error` says why its status could not be read."""

    node_id: str
    address: str
    port: int
    state: str
    role: str | None
    last_seen_s: float | None
    incarnation: int | None
    health: str | None
    term: int | None
    is_coordinator: bool
    wal_pending: int | None
    wal_oldest_pending_age_s: float | None
    breakers_open: tuple[str, ...]
    gpus: tuple[GpuReading, ...]
    version: str | None
    config_hash: str | None
    version_drift: bool
    config_drift: bool
    error: str | None
    jobs_running: int | None = None

    @property
    def failing(self) -> bool:
        """True when this node makes the cluster not OK: not alive, unreachable, or not healthy.

        A node that left the cluster on purpose is not a failure.
        """
        if self.state == "left":
            return False
        return self.state != "alive" or self.error is not None or self.health != "healthy"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "address": self.address,
            "port": self.port,
            "state": self.state,
            "role": self.role,
            "last_seen_s": self.last_seen_s,
            "health": self.health,
            "wal_pending": self.wal_pending,
            "wal_oldest_pending_age_s": self.wal_oldest_pending_age_s,
            "breakers_open": list(self.breakers_open),
            "gpus": [gpu.to_dict() for gpu in self.gpus],
            "version": self.version,
            "error": self.error,
            "incarnation": self.incarnation,
            "term": self.term,
            "is_coordinator": self.is_coordinator,
            "config_hash": self.config_hash,
            "version_drift": self.version_drift,
            "config_drift": self.config_drift,
            "jobs_running": self.jobs_running,
        }


@dataclass(frozen=True)
class FailureEvent:
    """A node that died, turned suspect, became unreachable or flapped; `at` is unix time."""

    node_id: str
    kind: str
    at: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ClusterSummary:
    """Totals of the footer."""

    cluster: str | None
    nodes_total: int
    nodes_alive: int
    nodes_suspect: int
    nodes_dead: int
    nodes_left: int
    nodes_unknown: int
    nodes_unreachable: int
    nodes_healthy: int
    nodes_degraded: int
    nodes_unhealthy: int
    gpus_total: int
    gpus_faulty: int
    wal_pending_total: int
    breakers_open_total: int
    version_majority: str | None
    config_hash_majority: str | None
    drifted: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["drifted"] = list(self.drifted)
        return data


@dataclass(frozen=True)
class ClusterStatus:
    """The whole cluster at one moment (`time`: unix seconds); rendering is a function of it."""

    time: float
    coordinator: str | None
    term: int | None
    nodes: tuple[NodeRow, ...]
    summary: ClusterSummary
    recent_failures: tuple[FailureEvent, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when every node is alive (or left on purpose), reachable and healthy."""
        return bool(self.nodes) and not any(row.failing for row in self.nodes)

    @property
    def exit_code(self) -> int:
        """0 when `ok`, else 1 (for cron and scripts)."""
        return 0 if self.ok else 1

    def node(self, node_id: str) -> NodeRow | None:
        return next((row for row in self.nodes if row.node_id == node_id), None)

    def to_dict(self) -> dict[str, Any]:
        """The --json document: time, coordinator, term, nodes, summary."""
        summary = self.summary.to_dict()
        summary["ok"] = self.ok
        summary["recent_failures"] = [event.to_dict() for event in self.recent_failures]
        return {
            "time": self.time,
            "coordinator": self.coordinator,
            "term": self.term,
            "nodes": [row.to_dict() for row in self.nodes],
            "summary": summary,
        }
