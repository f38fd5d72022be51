"""The JSON files of a job's directory as TypedDicts: what node.jobs.supervise (standard library
only, run as a script: it names them for mypy only) writes and reads, and node.jobs.files checks.
This module imports nothing of shoal, so the script's type-only import of it closes no cycle."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class RunAsJson(TypedDict):
    """The user a job runs as (node.jobs.policy.RunAs)."""

    uid: int
    gid: int
    groups: list[int]


class LaunchJson(TypedDict):
    """`launch.json`: what the supervisor runs (node.jobs.launcher.launch_document)."""

    argv: list[str]
    executable: str | None
    env: dict[str, str]
    cwd: str
    timeout_s: float | None
    kill_grace_s: float
    max_log_bytes: int
    user: RunAsJson | None


class KillJson(TypedDict):
    """`kill.json`: a kill request, the signal's name and the seconds until SIGKILL."""

    signal: str
    grace_s: float


class StartedJson(TypedDict):
    """`supervisor.json` once the job runs: its pid and process group, the supervisor's pid,
    the pid's start time in clock ticks (a reused pid is told apart); a gang's own record has
    only `started_at` and `pid` (None)."""

    started_at: float | None
    pid: int | None
    supervisor_pid: NotRequired[int]
    pgid: NotRequired[int]
    start_ticks: NotRequired[int | None]


class JobResultJson(TypedDict):
    """`result.json`: how the job ended (written by its supervisor, or by the daemon when no
    exit status was observed); `log_capped` per stream when a supervisor wrote it."""

    state: str
    exit_code: int | None
    signal: str | None
    reason: str | None
    started_at: float | None
    ended_at: float
    log_capped: NotRequired[dict[str, bool]]
