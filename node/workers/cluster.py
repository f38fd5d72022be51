"""`Cluster`: a `WorkerServer` on each node started as a shoal job (no SSH loop), the
`RemoteWorker`s connected to them, and their NCCL settings; `from_plan` takes the nodes of a
role, in rank order, from the coordinator's plan."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from net import peer_url
from node.errors import JobClientError, WorkerError
from node.jobs.client import local_endpoint, local_settings, start_job, stream_logs, terminate
from node.jobs.specs import DeploySpec, JobSpec, make_job_state
from node.jobs.transport import ENDED_STATES, JobClientState, request_json, run_sync
from node.workers.nccl import DEFAULT_MASTER_PORT, create_nccl_configs
from node.workers.remote import RemoteWorker

DEFAULT_DAEMON_PORT = 8770
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NodeConfig:
    """A node to run `num_workers` workers on: its host, the port its worker server listens on
    (0: any free port) and the URL of its shoal daemon (default http://host:8770)."""

    host: str
    num_workers: int = 1
    base_port: int = 0
    daemon_url: str | None = None
    node_id: str | None = None

    @property
    def url(self) -> str:
        return self.daemon_url or peer_url(self.host, DEFAULT_DAEMON_PORT)


@dataclass
class _Started:
    node: NodeConfig
    state: JobClientState
    port: int = 0
    workers: list[RemoteWorker] = field(default_factory=list)


class Cluster:
    """Worker servers on `nodes`, started by `start` and ended (with their jobs) by `stop`."""

    def __init__(
        self,
        nodes: Sequence[NodeConfig],
        *,
        secret_file: str | Path | None = None,
        config_file: str | None = None,
        master_addr: str | None = None,
        master_port: int = DEFAULT_MASTER_PORT,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if not nodes:
            raise WorkerError("a Cluster needs at least one node")
        self.nodes = tuple(nodes)
        self.config_file = config_file
        if secret_file is None:
            secret_file = local_settings(config_file).secret_file
        self.secret_file = None if secret_file is None else str(secret_file)
        self.nccl_configs = create_nccl_configs(
            master_addr or self.nodes[0].host,
            [n.num_workers for n in self.nodes],
            master_port,
        )
        self.start_timeout_s = start_timeout_s
        self._started: list[_Started] = []

    @classmethod
    def from_plan(
        cls,
        daemon_url: str,
        role: str = "training",
        *,
        num_workers: int = 1,
        config_file: str | None = None,
        secret_file: str | Path | None = None,
        plan_timeout_s: float = START_TIMEOUT_S,
        gpus: int = 0,
    ) -> Cluster:
        """The nodes of `role` in the plan `daemon_url` applies (training nodes in rank order),
        each with `num_workers` workers; NCCL settings from the plan's rendezvous. Waits up to
        `plan_timeout_s` for a plan that names alive nodes of that role (with `gpus`: nodes
        that advertise at least that many GPUs)."""
        settings = local_settings(config_file)
        endpoint = local_endpoint(settings, daemon_url)
        deadline = time.monotonic() + plan_timeout_s
        while True:
            announce, peers = run_sync(_plan_and_peers(endpoint))
            try:
                nodes, master_addr, master_port = nodes_of_plan(
                    announce, peers, role, num_workers, gpus
                )
                break
            except WorkerError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)  # the election has not published a plan with these nodes yet
        return cls(
            nodes,
            secret_file=secret_file,
            config_file=config_file,
            master_addr=master_addr,
            master_port=master_port,
        )

    def start(
        self, work_fn: str, env: Mapping[str, str] | None = None, name: str = "workers"
    ) -> list[RemoteWorker]:
        """Start a worker server on every node (as a shoal job), connect every worker and
        return them in rank order once all are ready; on any failure everything is stopped."""
        if self._started:
            raise WorkerError("this Cluster is already started; stop() it first")
        try:
            for node in self.nodes:
                self._started.append(self._start_server(node, work_fn, env or {}, name))
            for started in self._started:
                started.workers = [
                    RemoteWorker(started.node.host, started.port, self.secret_file)
                    for _ in range(started.node.num_workers)
                ]
        except BaseException:
            self.stop()
            raise
        return self.workers

    @property
    def workers(self) -> list[RemoteWorker]:
        return [worker for started in self._started for worker in started.workers]

    @property
    def job_states(self) -> list[JobClientState]:
        """The job state (node.jobs.client) of each node's worker server."""
        return [started.state for started in self._started]

    def _start_server(
        self, node: NodeConfig, work_fn: str, env: Mapping[str, str], name: str
    ) -> _Started:
        argv = [sys.executable, "-m", "node.cli", "workers", "serve"]
        argv += ["--host", node.host, "--port", str(node.base_port)]
        argv += ["--workers", str(node.num_workers), "--work-fn", work_fn]
        if self.secret_file is not None:
            argv += ["--secret-file", self.secret_file]
        deploy = DeploySpec(node_url=node.url, config_file=self.config_file)
        state = make_job_state()
        start_job(deploy, JobSpec(tuple(argv), env=dict(env), name=name), state)
        started = _Started(node, state)
        started.port = self._listening_port(started)
        return started

    def _listening_port(self, started: _Started) -> int:
        return listening_port(started.state, self.start_timeout_s, started.node.url)

    def stop(self) -> None:
        """Close every worker and end every server job (their processes end with them)."""
        for started in self._started:
            for worker in started.workers:
                worker.close()
        for started in self._started:
            if started.state.get("status") not in ENDED_STATES:
                with contextlib.suppress(JobClientError):
                    terminate(started.state, grace_s=5.0)
        self._started = []

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def listening_port(state: JobClientState, timeout_s: float, where: str) -> int:
    """The port a server job prints on stdout as {"event": "listening", "port": P}."""
    deadline = time.monotonic() + timeout_s
    lines = stream_logs(state, follow=True)
    with contextlib.closing(lines):
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "listening":
                    return int(event["port"])
            if time.monotonic() > deadline:
                break
    raise WorkerError(
        f"the server job {state['job_id']} on {where} did not start listening (job state "
        f"{state.get('status')}); see: shoal jobs logs {state['job_id']} --stream stderr"
    )


async def _plan_and_peers(endpoint: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        announce = await request_json(endpoint, "GET", "/v1/plan")
        peers = await request_json(endpoint, "GET", "/v1/peers")
    except (JobClientError, TimeoutError) as exc:
        raise WorkerError(f"cannot read the plan from {endpoint.url}: {exc}") from exc
    members = peers.get("members", []) if isinstance(peers, dict) else []
    return dict(announce), [dict(m) for m in members]


def gpu_count(member: Mapping[str, Any]) -> int:
    """The GPUs a member advertises (its membership meta `gpu_count`)."""
    meta = member.get("meta") or {}
    return int(meta.get("gpu_count") or 0)


def nodes_of_plan(
    announce: Mapping[str, Any],
    members: Sequence[Mapping[str, Any]],
    role: str,
    num_workers: int,
    gpus: int = 0,
) -> tuple[list[NodeConfig], str, int]:
    """(nodes of `role` in rank order, master address, master port) of a plan announce; with
    `gpus`, only nodes that advertise at least that many GPUs, most GPUs first (training
    nodes keep their rank order); never a node the plan drains (its workers and actors would be
    new work there)."""
    plan = announce.get("plan")
    if not isinstance(plan, Mapping):
        raise WorkerError("the daemon has no role plan yet; wait for the election to finish")
    roles: Mapping[str, str] = plan.get("roles", {})
    ranked = list(plan.get("training_ranks", [])) if role == "training" else []
    ids = ranked or sorted(node for node, r in roles.items() if role in (r, "any"))
    draining = plan.get("draining") or {}
    ids = [i for i in ids if i not in draining]
    by_id = {str(m.get("node_id")): m for m in members}
    if gpus > 0:
        ids = [i for i in ids if gpu_count(by_id.get(i, {})) >= gpus]
        if not ranked:
            ids.sort(key=lambda i: -gpu_count(by_id[i]))
    nodes: list[NodeConfig] = []
    for node_id in ids:
        member = by_id.get(node_id)
        if member is None or member.get("state") != "alive":
            raise WorkerError(f"node {node_id} of role {role} is not an alive member")
        host, port = str(member["address"]), int(member["port"])
        url = peer_url(host, port)
        nodes.append(NodeConfig(host, num_workers, 0, url, node_id))
    if not nodes:
        with_gpus = f" with {gpus} GPUs" if gpus else ""
        raise WorkerError(f"the plan gives no node{with_gpus} the role {role!r}")
    rendezvous = plan.get("rendezvous", {})
    master_addr = str(rendezvous.get("master_addr") or nodes[0].host)
    master_port = int(rendezvous.get("master_port") or DEFAULT_MASTER_PORT)
    return nodes, master_addr, master_port
