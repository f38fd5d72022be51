"""The JSON documents of the dashboard's event stream topics (node.ui.topics), as TypedDicts of
plain JSON types: the keys the page reads, checked by mypy where a topic builds them."""

from __future__ import annotations

from typing import TypedDict

from pydantic import JsonValue

from health import HealthJson


class GpuRow(TypedDict):
    """One GPU of a member, as its own /v1/status reports it."""

    index: int
    name: str
    util_pct: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    temperature_c: float | None
    healthy: bool
    problems: list[str]


class DrainMark(TypedDict):
    """A member the plan drains: its jobs are killed after `kill_after_s` (None: they finish)."""

    kill_after_s: float | None


class MemberRow(TypedDict):
    """One member of the view on the members page (node.ui.topics.member_rows)."""

    node_id: str
    address: str
    state: str
    refused: str | None
    incarnation: int
    last_seen_s: float
    role: str | None
    rank: int | None
    drain: DrainMark | None
    quarantine: str | None
    version: str | None
    gpus: int
    gpu: str | None
    gpu_list: list[GpuRow] | None
    health: str | None
    health_problems: list[str]
    status_at: float | None
    stale: bool
    status_error: str | None
    config_hash: str | None
    is_self: bool


class PlanSummary(TypedDict):
    """The plan as the members page heads it."""

    term: int
    version: int
    note: str
    draining: dict[str, float | None]
    quarantined: dict[str, str]


class MembersTopic(TypedDict):
    members: list[MemberRow]
    plan: PlanSummary | None


class JobsTopic(TypedDict):
    summary: dict[str, int]
    """How many jobs are in each state."""
    jobs: list[dict[str, JsonValue]]
    """The newest jobs' JobRecord JSON."""


class AppliedWeights(TypedDict):
    """A node's applied weights of one run: version, when and from where."""

    version: int
    applied_at: float | None
    source: str | None


class RunWeightsRow(TypedDict, total=False):
    """One run of this node: versions offered and applied (with the applied status's JSON) while
    the weights service knows it, rollouts pending while the backlog does."""

    offered_version: int | None
    applied_version: int | None
    applied: dict[str, JsonValue] | None
    pending: int
    max_pending: int
    refusing: bool


class NodeWeights(TypedDict):
    """One node's applied weights of every run of the cluster (None: none applied there), and
    whether its last answer is stale and why."""

    runs: dict[str, AppliedWeights | None]
    answered_at: float | None
    stale: bool
    error: str | None


class RlTopic(TypedDict):
    runs: dict[str, RunWeightsRow]
    cluster_runs: list[str]
    stale_drops: float | None
    nodes: dict[str, NodeWeights]


class RunsTopic(TypedDict, total=False):
    """The lock table's locks and its queued runs in queue order (`coordinator` and `version`
    only where this node has a lock service)."""

    coordinator: str | None
    version: list[int]
    locks: dict[str, JsonValue]
    runs: list[dict[str, JsonValue]] | dict[str, JsonValue]
    """The queued runs' RunRecord JSON; an empty object where this node has no lock service."""


class BreakerRow(TypedDict):
    peer: str
    transport: str
    state: str
    failures: int
    retry_after_s: float | None


class WalSummary(TypedDict):
    pending: int
    oldest_pending_age_s: float | None


class NodeTopic(TypedDict):
    node_id: str
    health: HealthJson | None
    breakers: list[BreakerRow]
    wal: WalSummary | None
