"""The JSON that cluster_monitor writes (`--json`) of a node's auto-stop, drain and training and
of a failure event, as TypedDicts of plain JSON types."""

from __future__ import annotations

from typing import TypedDict


class AutostopJson(TypedDict):
    """AutostopInfo as the monitor's JSON writes it."""

    enabled: bool
    state: str
    action: str | None
    dry_run: bool
    idle_for_s: float | None
    window_s: float | None
    busy_reasons: list[str]


class DrainJson(TypedDict, total=False):
    """DrainInfo as the monitor's JSON writes it: `kill_after_s` while draining, else
    `draining` (false); `quarantine` while quarantined."""

    kill_after_s: float | None
    draining: bool
    quarantine: str


class TrainingJson(TypedDict):
    """TrainingInfo as the monitor's JSON writes it."""

    ranks: int
    step: int
    steps_per_s: float
    generation: int | None


class FailureEventJson(TypedDict):
    """FailureEvent as the monitor's JSON writes it."""

    node_id: str
    kind: str
    at: float
    detail: str
