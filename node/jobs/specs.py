"""What a job client runs and where: the frozen JobSpec and DeploySpec, the client's job state,
and the POST /v1/jobs body they make."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from node.jobs.transport import JobClientState
from node.providers import GPUQuery, Provider

ROLES = frozenset({"training", "inference", "selfplay", "any"})


@dataclass(frozen=True)
class JobSpec:
    """What to run: an argv tuple (never a shell string), extra environment, a timeout in
    seconds, and `log_file`, a local file `stream_logs` appends every line it yields to.
    `nodes` > 1 makes a gang job of that many nodes of `role`; `env_from="rendezvous"` adds the
    node's training rendezvous to the environment; `job_id` defaults to a fresh one."""

    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    log_file: str | None = None
    name: str | None = None
    nodes: int = 1
    role: str | None = None
    job_id: str | None = None
    env_from: str | None = None

    def __post_init__(self) -> None:
        given: object = self.command
        if isinstance(given, str):
            raise TypeError(
                f"JobSpec.command must be an argv tuple, not the string {given!r}; "
                "to run a shell line pass ('sh', '-c', LINE)"
            )
        command = tuple(self.command)
        if not command or not all(isinstance(arg, str) for arg in command):
            raise ValueError(f"JobSpec.command must be a non-empty tuple of str, got {command!r}")
        object.__setattr__(self, "command", command)
        env = dict(self.env)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("JobSpec.env must map str to str")
        object.__setattr__(self, "env", env)
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"JobSpec.timeout must be positive seconds, got {self.timeout!r}")
        if self.nodes < 1:
            raise ValueError(f"JobSpec.nodes must be at least 1, got {self.nodes}")
        if self.role is not None and self.role not in ROLES:
            raise ValueError(f"JobSpec.role must be one of {sorted(ROLES)}, got {self.role!r}")
        if self.env_from not in (None, "rendezvous"):
            raise ValueError(f"JobSpec.env_from must be 'rendezvous', got {self.env_from!r}")


@dataclass(frozen=True)
class DeploySpec:
    """Where to run: at most one of `node_url`, `ssh`, `node_id` (a member of the local
    daemon's view) or `provision`; none means the local daemon. `workspace` is the job's
    working directory on the node (default: one the node makes for the job); `bootstrap` an
    argv run first in `workspace` (then absolute) that must exit 0; `keep_alive` leaves the job
    running when `run_job` exits. `config_file` gives the secret and the local daemon's
    address (default $SHOAL_CONFIG)."""

    node_url: str | None = None
    ssh: str | None = None
    node_id: str | None = None
    provision: GPUQuery | None = None
    workspace: str | None = None
    bootstrap: tuple[str, ...] | None = None
    keep_alive: bool = False
    config_file: str | None = None
    provider: Provider | None = None
    """Who acquires a `provision` (or `node_id`-less `ssh`) node: default the inventory's hosts
    (the `static` provider). What it acquired is released when the job is terminated, unless
    `keep_alive`."""

    def __post_init__(self) -> None:
        modes = [m for m in ("node_url", "ssh", "node_id", "provision") if getattr(self, m)]
        if len(modes) > 1:
            raise ValueError(f"DeploySpec takes at most one of {', '.join(modes)}")
        given: object = self.bootstrap
        if isinstance(given, str):
            raise TypeError("DeploySpec.bootstrap must be an argv tuple, never a shell string")
        if self.bootstrap is not None:
            object.__setattr__(self, "bootstrap", tuple(self.bootstrap))
            if not (self.workspace and self.workspace.startswith("/")):
                raise ValueError(
                    "DeploySpec.bootstrap needs an absolute workspace, the directory the "
                    "bootstrap and the job share (a relative cwd is inside each job's own "
                    f"directory); got workspace={self.workspace!r}"
                )


def make_job_state() -> JobClientState:
    """A fresh job state: the functions below fill it in and read it."""
    return {
        "job_id": None,
        "node_url": None,
        "secret_file": None,
        "request_timeout_s": 10.0,
        "log_file": None,
        "status": "pending",
        "exit_code": None,
        "signal": None,
        "reason": None,
        "node": None,
        "record": None,
    }


def new_job_id() -> str:
    """A job id chosen by the client, so that a retried start is harmless."""
    return f"j-{secrets.token_hex(8)}"


class JobStartBody(TypedDict):
    """A POST /v1/jobs body as the client sends it: a field at its default is left out."""

    job_id: str
    name: str
    argv: list[str]
    env: NotRequired[dict[str, str]]
    cwd: NotRequired[str]
    timeout_s: NotRequired[float]
    nodes: NotRequired[int]
    role: NotRequired[str]
    env_from: NotRequired[str]


def start_body(job: JobSpec, deploy: DeploySpec, job_id: str) -> JobStartBody:
    """The POST /v1/jobs body for `job` placed by `deploy`."""
    body: JobStartBody = {
        "job_id": job_id,
        "name": job.name or os.path.basename(job.command[0]),
        "argv": list(job.command),
    }
    if job.env:
        body["env"] = dict(job.env)
    if deploy.workspace:
        body["cwd"] = deploy.workspace
    if job.timeout is not None:
        body["timeout_s"] = job.timeout
    if job.nodes != 1:
        body["nodes"] = job.nodes
    if job.role is not None:
        body["role"] = job.role
    if job.env_from is not None:
        body["env_from"] = job.env_from
    return body
