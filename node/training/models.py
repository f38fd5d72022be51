"""What crosses the wire about training progress: the reports a training process posts, a node's
part of the group's progress, the group's document (GET /v1/training) and the restart request;
each a pydantic model whose JSON Schema the OpenAPI document shows."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import BaseModel, Field, JsonValue

from node.openapi import BODY_CONFIG, Count, WholeNumber, WireRecord

TRAINING_PATH = "/v1/training"
REPORTS_PATH = "/v1/training/reports"
NODE_PATH = "/v1/training/node"
RESTART_PATH = "/v1/training/restart"
MAX_REPORTS = 512
"""Reports in one POST (shoal.report sends at most as many)."""
MAX_SCALARS = 32
MAX_SCALAR_NAME = 64
MAX_DETAIL_CHARS = 300

ScalarName = Annotated[str, Field(min_length=1, max_length=MAX_SCALAR_NAME)]
Seconds = Annotated[float, Field(ge=0)]


class RestartReason(enum.StrEnum):
    """Why the training group moved to a new generation."""

    HANG = "hang"
    """No rank advanced for the hang timeout: every worker was stopped and restarted."""
    WORKER_EXIT = "worker_exit"
    """A worker exited (or its node gave up training): the whole group restarted."""
    MEMBER_LOST = "member_lost"
    """A training node died or left."""
    GPU_FAULT = "gpu_fault"
    """A training node's GPU was quarantined."""
    PLAN_CHANGE = "plan_change"
    """Any other change of the group: a node joined, was drained, changed its preference."""


class Report(BaseModel):
    """One step a rank finished."""

    model_config = BODY_CONFIG

    step: Count
    at: float = Field(ge=0, description="when, unix seconds of the training process's host")
    compute_s: Seconds | None = Field(
        default=None, description="the rank's own work in the step, without waiting for others"
    )
    scalars: dict[ScalarName, float] = Field(
        default_factory=dict, max_length=MAX_SCALARS, description="loss and the like, by name"
    )


class ReportsBody(BaseModel):
    """Body of POST /v1/training/reports: a batch of one rank's reports (shoal.report)."""

    model_config = BODY_CONFIG

    generation: Count
    rank: Count
    local_rank: Count
    world_size: WholeNumber = Field(ge=1, le=2**31)
    pid: Count
    dropped: Count = Field(default=0, description="reports the process dropped since its last")
    reports: list[Report] = Field(max_length=MAX_REPORTS)
    broken: str = Field(
        default="",
        max_length=MAX_DETAIL_CHARS,
        description="the process's group of `generation` broke under it (a collective failed; "
        "training_reform: in_place): why. The node asks the coordinator for a new generation, "
        "as for a worker that exited",
    )


class ReportsAnswer(WireRecord):
    """The answer to a batch of reports: how many were kept, and the node's generation (a
    process of an older one is superseded)."""

    accepted: int
    generation: int | None


class RankProgress(WireRecord):
    """One rank as its node sees it. `compute_s` is the median of its last `straggler_window`
    reported compute times, `compute_min_s` their minimum and `compute_samples` their count;
    `last_advance_age_s` is since its step last rose."""

    rank: int
    node: str
    local_rank: int
    generation: int
    step: int
    steps_per_s: float
    last_report_age_s: float
    last_advance_age_s: float
    compute_s: float | None = None
    compute_min_s: float | None = None
    compute_samples: int = 0
    straggler: bool = False
    gpu: str | None = Field(default=None, description="the GPU it trains on (UUID), if any")
    pid: int | None = None
    scalars: dict[str, float] = Field(default_factory=dict)
    dropped: int = Field(default=0, description="reports its process dropped")


class RankHistory(WireRecord):
    """A rank's last 15 minutes, one sample every few seconds: `at` (unix s), steps/s, compute
    seconds and each scalar, aligned by index."""

    at: list[float] = Field(default_factory=list)
    steps_per_s: list[float] = Field(default_factory=list)
    compute_s: list[float | None] = Field(default_factory=list)
    scalars: dict[str, list[float | None]] = Field(default_factory=dict)


class GpuHistory(WireRecord):
    """One GPU this node owns over the last 15 minutes, one NVML reading every few seconds:
    `at` (unix s), utilization and memory used, aligned by index (None: not read)."""

    index: int
    uuid: str
    name: str
    memory_total_mb: float | None = None
    at: list[float] = Field(default_factory=list)
    util_pct: list[float | None] = Field(default_factory=list)
    memory_used_mb: list[float | None] = Field(default_factory=list)


class NodeProgress(WireRecord):
    """GET /v1/training/node: this node's part of the group. `generation_age_s` is since the
    node adopted its plan's generation; `reporting`: its ranks have reported since the daemon
    started (a script that uses shoal.training_session); `parts` are what other packages add
    (node.checkpoints: `last_restore`)."""

    node: str
    generation: int | None
    generation_age_s: float | None = None
    reporting: bool = False
    workers_running: int = 0
    ranks: list[RankProgress] = Field(default_factory=list)
    parts: dict[str, JsonValue] = Field(default_factory=dict)
    history: dict[str, RankHistory] | None = Field(
        default=None, description="with ?history=1: each rank's last 15 minutes, by rank"
    )
    gpu_history: list[GpuHistory] | None = Field(
        default=None, description="with ?history=1: each owned GPU's last 15 minutes"
    )


class Restart(WireRecord):
    """One move of the group to a new generation, as this node adopted it."""

    at: float
    generation: int
    reason: RestartReason
    detail: str = ""


class StragglerEvent(WireRecord):
    """A rank flagged as a straggler: its compute time stayed above the group's median times
    the straggler factor for `straggler_window` steps."""

    at: float
    node: str
    rank: int
    gpu: str | None
    compute_s: float
    median_s: float
    action: str = Field(description="report, or drain (the node was drained)")


class NodePart(WireRecord):
    """What the group's document says of one training node beyond its ranks."""

    reachable: bool
    last_restore: JsonValue = Field(
        default=None,
        description="the node's newest checkpoint restore: step, from (local | peers), bytes, "
        "fetched_bytes, seconds, at (node.checkpoints); null before one",
    )
    parts: dict[str, JsonValue] = Field(default_factory=dict)


class TrainingView(WireRecord):
    """GET /v1/training: the whole training group, from any node. `missing` names the
    training nodes whose part could not be read in time (the answer is partial); `hung` is the
    hang verdict over the ranks read; `committed` and each node's parts (`last_restore`) come
    from node.checkpoints."""

    answered_by: str
    coordinator: str | None
    generation: int | None
    world_size: int
    hung: bool
    hang_timeout_s: float
    ranks: list[RankProgress]
    restarts: list[Restart]
    stragglers: list[StragglerEvent] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    nodes: dict[str, NodePart] = Field(default_factory=dict)
    committed: JsonValue = None
    history: dict[str, RankHistory] | None = None
    gpu_history: dict[str, list[GpuHistory]] | None = Field(
        default=None, description="with ?history=1: each training node's GPUs, by node"
    )


class RestartBody(BaseModel):
    """Body of POST /v1/training/restart: a node asks the coordinator to restart the group of
    `generation` (its worker exited)."""

    model_config = BODY_CONFIG

    generation: Count
    reason: Literal["hang", "worker_exit"] = Field(description="why (a RestartReason)")
    detail: str = Field(default="", max_length=MAX_DETAIL_CHARS)


class RestartAnswer(WireRecord):
    """The coordinator's answer: whether it restarts the group, and the generation it runs."""

    accepted: bool
    generation: int | None
    reason: str
