"""The JSON of a job as TypedDicts: a start request as a job's spec.json and WAL entry keep it,
and a job's record as the Python client reads it (JobRecord's JSON)."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pydantic import JsonValue

Role = Literal["training", "inference", "selfplay", "any"]
"""The role a job asks for (node.jobs.records checks it)."""


class JobSpecJson(TypedDict):
    """A start request but its id, as JobRequest.spec writes it (env sorted by name)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    timeout_s: float | None
    nodes: int
    role: Role
    env_from: str | None
    gang: dict[str, JsonValue] | None


class JobRequestJson(JobSpecJson):
    """A start request as the job's spec.json and its WAL entry keep it (`job_id` first)."""

    job_id: str | None


class JobRecordJson(TypedDict):
    """A JobRecord as every job route answers it; `gang` only for a gang job."""

    job_id: str
    name: str
    node: str
    argv: list[str]
    state: str
    exit_code: int | None
    signal: str | None
    reason: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    pid: int | None
    log_bytes: dict[str, int]
    log_capped: dict[str, bool]
    max_log_bytes: int
    cwd: str | None
    timeout_s: float | None
    nodes: int
    role: str
    gang: NotRequired[dict[str, JsonValue]]
