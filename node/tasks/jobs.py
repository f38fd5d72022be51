"""Cluster-level jobs in fray's shape, for code that launches whole jobs: `submit(JobRequest)`
-> `JobHandle` (wait/status/terminate) over shoal's job API; `nodes > 1` makes a gang job, and
a single-node job asking for GPUs goes to the alive node of its role with the most GPUs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from node.errors import JobClientError, JobFailedError, TaskError
from node.jobs.client import local_endpoint, local_settings, poll_status, start_job, terminate
from node.jobs.specs import DeploySpec, JobSpec, make_job_state
from node.jobs.transport import ENDED_STATES, JobClientState, request_json, run_sync, wait_record


@dataclass(frozen=True)
class ResourceConfig:
    """Where a job may run: nodes of `role` ("any" for every role), how many, and the GPUs
    each node must have."""

    role: str = "any"
    nodes: int = 1
    gpus: int = 0


@dataclass(frozen=True)
class JobRequest:
    """A job: its name, the argv to run (never a shell string), resources and environment."""

    name: str
    entrypoint: Sequence[str]
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    env: Mapping[str, str] = field(default_factory=dict)


def place(members: Sequence[Mapping[str, Any]], role: str, gpus: int) -> list[str]:
    """Alive members of `role` with at least `gpus` GPUs, most GPUs first (then by id)."""
    fits = []
    for member in members:
        meta = member.get("meta") or {}
        count = int(meta.get("gpu_count") or 0)
        member_role = member.get("role") or meta.get("role")
        if member.get("state") != "alive" or count < gpus:
            continue
        if role != "any" and member_role != role:
            continue
        fits.append((-count, str(member["node_id"])))
    return [node_id for _, node_id in sorted(fits)]


class JobHandle:
    """A submitted job; its state follows node.jobs.client's job state."""

    def __init__(self, request: JobRequest, state: JobClientState) -> None:
        self.request = request
        self.state = state

    @property
    def job_id(self) -> str:
        return str(self.state["job_id"])

    def status(self) -> str:
        """pending, running, succeeded, failed, killed, timed_out or lost."""
        return poll_status(self.state)

    def wait(self, timeout_s: float | None = None, raise_on_failure: bool = True) -> str:
        """The final state once the job ended; JobFailedError when it did not succeed and
        `raise_on_failure`; TaskError (a TimeoutError) when `timeout_s` passes first."""
        try:
            record = run_sync(wait_record(self.state, 2.0, timeout_s))
        except JobClientError as exc:
            raise TaskError(f"job {self.request.name} ({self.job_id}): {exc}") from exc
        final = str(record.get("state"))
        if raise_on_failure and final != "succeeded":
            raise JobFailedError(
                f"job {self.request.name} ({self.job_id}) ended {final} (exit code "
                f"{record.get('exit_code')}, reason: {record.get('reason')}); see: shoal jobs "
                f"logs {self.job_id}"
            )
        return final

    def terminate(self) -> None:
        if self.state.get("status") not in ENDED_STATES:
            terminate(self.state)


def submit(
    request: JobRequest, daemon_url: str | None = None, config_file: str | None = None
) -> JobHandle:
    """Start `request` through the job API of `daemon_url` (default: this host's daemon)."""
    resources = request.resources
    node_id = None
    if resources.nodes == 1 and resources.gpus > 0:
        endpoint = local_endpoint(local_settings(config_file), daemon_url)
        peers = run_sync(request_json(endpoint, "GET", "/v1/peers"))
        fits = place(peers.get("members", []), resources.role, resources.gpus)
        if not fits:
            raise TaskError(
                f"no alive node of role {resources.role!r} has {resources.gpus} GPUs; see: "
                "shoal peers"
            )
        node_id = fits[0]
    deploy = DeploySpec(node_url=daemon_url, config_file=config_file)
    if node_id is not None:
        deploy = DeploySpec(node_id=node_id, config_file=config_file)
    spec = JobSpec(
        tuple(request.entrypoint),
        env=dict(request.env),
        name=request.name,
        nodes=resources.nodes,
        role=None if resources.role == "any" and resources.nodes == 1 else resources.role,
    )
    state = make_job_state()
    start_job(deploy, spec, state)
    return JobHandle(request, state)
