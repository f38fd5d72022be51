"""Plain data of cluster_monitor: what nodes said (status, membership views), one row per node,
and the whole cluster; parsers from the JSON of /v1/status and /v1/peers that never trust it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from health.errors import MonitorError
from health.fields import read_float, read_int, read_list, read_mapping, read_str
from health.gpu import GpuInfo
from health.monitor.documents import AutostopJson, DrainJson, FailureEventJson, TrainingJson

__all__ = [
    "AutostopInfo",
    "ClusterStatus",
    "ClusterSummary",
    "FailureEvent",
    "MonitorError",
    "NodeReport",
    "NodeRow",
    "NodeStatusDoc",
    "Observation",
    "TrainingInfo",
    "parse_peers",
    "parse_status",
]

MEMBER_STATES = ("alive", "suspect", "dead", "left")
UNKNOWN_STATE = "unknown"
"""State of a node no fetched membership view mentions."""


@dataclass(frozen=True)
class AutostopInfo:
    """A node's auto-stop as its /v1/status `autostop` object says: off, or its state (starting,
    idle, busy, acting, acted), action, idle time against the window, and why it is busy."""

    enabled: bool
    state: str
    action: str | None = None
    dry_run: bool = False
    idle_for_s: float | None = None
    window_s: float | None = None
    busy_reasons: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> AutostopInfo | None:
        """None when the node sent no `autostop` object (an older node); wrong types read as
        unknown, never an error."""
        if not isinstance(data, Mapping):
            return None
        enabled = data.get("enabled") is True
        return cls(
            enabled=enabled,
            state=read_str(data.get("state")) or ("?" if enabled else "off"),
            action=read_str(data.get("action")),
            dry_run=data.get("dry_run") is True,
            idle_for_s=read_float(data.get("idle_for_s")),
            window_s=read_float(data.get("window_s")),
            busy_reasons=tuple(str(r) for r in read_list(data.get("busy_reasons"))),
        )

    def to_json(self) -> AutostopJson:
        return AutostopJson(
            enabled=self.enabled,
            state=self.state,
            action=self.action,
            dry_run=self.dry_run,
            idle_for_s=self.idle_for_s,
            window_s=self.window_s,
            busy_reasons=list(self.busy_reasons),
        )


@dataclass(frozen=True)
class DrainInfo:
    """A node taken out: drained (`shoal node drain`; `kill_after_s` is when its jobs are
    killed, None to wait for them), or quarantined for a GPU fault (`quarantine`: the reason)."""

    kill_after_s: float | None = None
    quarantine: str | None = None
    draining: bool = True

    @classmethod
    def from_json(cls, value: Any, quarantine: Any = None) -> DrainInfo | None:
        """The drain of a status document's `drain` (an object) and its `quarantine` (an
        object with a `reason`); None when both are null or junk."""
        reason = read_str(quarantine.get("reason")) if isinstance(quarantine, Mapping) else None
        if not isinstance(value, Mapping):
            return None if reason is None else cls(quarantine=reason, draining=False)
        return cls(read_float(value.get("kill_after_s")), reason)

    def to_json(self) -> DrainJson:
        """`{"kill_after_s"}` while draining, else `{"draining": false}`; with `quarantine`
        while quarantined."""
        data = (
            DrainJson(kill_after_s=self.kill_after_s)
            if self.draining
            else DrainJson(draining=False)
        )
        if self.quarantine is not None:
            data["quarantine"] = self.quarantine
        return data

    def text(self) -> str:
        """`draining`, with `kill Ns` when its jobs are killed after that grace; a quarantine's
        reason without its `gpu_fault: ` prefix."""
        parts = []
        if self.draining:
            after = self.kill_after_s
            parts.append("draining" if after is None else f"draining, kill {after:g}s")
        if self.quarantine is not None:
            parts.append(f"quarantined: {self.quarantine.removeprefix('gpu_fault: ')}")
        return "; ".join(parts)


@dataclass(frozen=True)
class TrainingInfo:
    """A node's training ranks as its /v1/status `training` object says: how many, their highest
    step and median steps per second, in which generation."""

    ranks: int
    step: int
    steps_per_s: float
    generation: int | None = None

    @classmethod
    def from_json(cls, value: Any) -> TrainingInfo | None:
        """None for null, junk, or an older node that sends no `training`."""
        if not isinstance(value, Mapping):
            return None
        step, rate = read_int(value.get("step")), read_float(value.get("steps_per_s"))
        if step is None or rate is None:
            return None
        ranks = read_int(value.get("ranks")) or 0
        return cls(ranks, step, rate, read_int(value.get("generation")))

    def to_json(self) -> TrainingJson:
        return TrainingJson(
            ranks=self.ranks,
            step=self.step,
            steps_per_s=self.steps_per_s,
            generation=self.generation,
        )

    def text(self) -> str:
        """`step 1234, 5.20/s`."""
        return f"step {self.step}, {self.steps_per_s:.2f}/s"


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
    gpus: tuple[GpuInfo, ...]
    config_hash: str | None
    health_problems: tuple[str, ...] = ()
    """`component: message` of each component that is not healthy (a failing loop's error)."""
    jobs_running: int | None = None
    autostop: AutostopInfo | None = None
    protocol: int | None = None
    """The node's wire protocol (`protocol` of /v1/status); None from a release before it."""
    drain: DrainInfo | None = None
    """The node's drain in the plan it applies (`drain` of /v1/status) or its GPU quarantine
    (`quarantine`), None when neither."""
    training: TrainingInfo | None = None
    """Its training ranks' progress (`training` of /v1/status), None while none reports."""


def parse_status(doc: Any) -> NodeStatusDoc:
    """A NodeStatusDoc from a /v1/status body; ValueError when it is not one."""
    if not isinstance(doc, Mapping) or not read_str(doc.get("node_id")):
        raise ValueError("not a status document (no node_id)")
    wal = read_mapping(doc.get("wal"))
    breakers = read_mapping(doc.get("breakers"))
    opened = read_list(breakers.get("open"))
    gpus = [gpu for gpu in read_list(doc.get("gpus")) if isinstance(gpu, Mapping)]
    return NodeStatusDoc(
        node_id=str(doc["node_id"]),
        cluster=read_str(doc.get("cluster")),
        version=read_str(doc.get("version")),
        address=read_str(doc.get("address")),
        port=read_int(doc.get("port")),
        role=read_str(doc.get("role")),
        term=read_int(doc.get("term")),
        coordinator=read_str(doc.get("coordinator")),
        health=read_str(doc.get("health")),
        wal_pending=read_int(wal.get("pending")),
        wal_oldest_pending_age_s=read_float(wal.get("oldest_pending_age_s")),
        breakers_open=tuple(str(name) for name in opened),
        gpus=tuple(GpuInfo.from_json(gpu, position) for position, gpu in enumerate(gpus)),
        config_hash=read_str(doc.get("config_hash")),
        health_problems=tuple(str(p) for p in read_list(doc.get("health_problems"))),
        jobs_running=read_int(read_mapping(doc.get("jobs")).get("running")),
        autostop=AutostopInfo.from_json(doc.get("autostop")),
        protocol=read_int(doc.get("protocol")),
        drain=DrainInfo.from_json(doc.get("drain"), doc.get("quarantine")),
        training=TrainingInfo.from_json(doc.get("training")),
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
    protocol: int | None = None
    refused: str | None = None
    """Why the observing node refuses this member (a revoked certificate), else None."""


def parse_peers(doc: Any) -> tuple[Observation, ...]:
    """The members of a /v1/peers body; ValueError when it is not one. Bad members are skipped."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("members"), list):
        raise ValueError("not a peers document (no members list)")
    found = []
    for member in doc["members"]:
        if not isinstance(member, Mapping):
            continue
        node_id, address = read_str(member.get("node_id")), read_str(member.get("address"))
        port, seen = read_int(member.get("port")), read_float(member.get("last_seen_s"))
        state = member.get("state")
        if node_id is None or address is None or port is None or seen is None:
            continue
        found.append(
            Observation(
                node_id=node_id,
                address=address,
                port=port,
                state=state if state in MEMBER_STATES else UNKNOWN_STATE,
                incarnation=read_int(member.get("incarnation")) or 0,
                last_seen_s=max(0.0, seen),
                is_self=bool(member.get("is_self")),
                role=read_str(member.get("role")),
                version=read_str(member.get("version")),
                protocol=read_int(member.get("protocol")),
                refused=read_str(member.get("refused")),
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
    gpus: tuple[GpuInfo, ...]
    version: str | None
    config_hash: str | None
    version_drift: bool
    config_drift: bool
    error: str | None
    health_problems: tuple[str, ...] = ()
    jobs_running: int | None = None
    autostop: AutostopInfo | None = None
    protocol: int | None = None
    """The node's wire protocol, from its status or a view; None when neither says."""
    refused: str | None = None
    """Why its peers refuse it (a revoked certificate: it shows dead), else None."""
    drain: DrainInfo | None = None
    """Its drain (from its status), None when it is not draining."""
    training: TrainingInfo | None = None
    """Its training ranks' step and steps/s (from its status), None while none reports."""

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
            "health_problems": list(self.health_problems),
            "wal_pending": self.wal_pending,
            "wal_oldest_pending_age_s": self.wal_oldest_pending_age_s,
            "breakers_open": list(self.breakers_open),
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "version": self.version,
            "release": self.version,
            "protocol": self.protocol,
            "error": self.error,
            "incarnation": self.incarnation,
            "term": self.term,
            "is_coordinator": self.is_coordinator,
            "config_hash": self.config_hash,
            "version_drift": self.version_drift,
            "config_drift": self.config_drift,
            "jobs_running": self.jobs_running,
            "autostop": None if self.autostop is None else self.autostop.to_json(),
            "refused": self.refused,
            "drain": None if self.drain is None else self.drain.to_json(),
            "training": None if self.training is None else self.training.to_json(),
        }


@dataclass(frozen=True)
class FailureEvent:
    """A node that died, turned suspect, became unreachable or flapped; `at` is unix time."""

    node_id: str
    kind: str
    at: float
    detail: str = ""

    def to_dict(self) -> FailureEventJson:
        return FailureEventJson(
            node_id=self.node_id, kind=self.kind, at=self.at, detail=self.detail
        )


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
    releases: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Every release the nodes run, oldest-named first, with the nodes running it."""
    release_warning: str | None = None
    """Set when more than two releases are mixed (rules.MAX_MIXED_RELEASES)."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["drifted"] = list(self.drifted)
        data["releases"] = {release: list(nodes) for release, nodes in self.releases}
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
