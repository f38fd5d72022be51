"""A node's part of the training group: the `Rendezvous` the daemon serves at GET /v1/rendezvous,
built from the applied role plan, and the client that fetches it from the local daemon.

Errors (defined in node/errors.py, re-exported here): GroupError, RendezvousError,
MasterUnreachable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypeGuard

from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema

from config import Timeouts, read_secret_file
from config.declare import unset
from net import BlockingPeerClient, Identity, PeerRequestError, peer_url
from node.errors import RendezvousError
from node.openapi import WireRecord
from node.plan import Backend, RolePlan

RENDEZVOUS_PATH = "/v1/rendezvous"
ENV_DAEMON_URL = "SHOAL_DAEMON_URL"
GENERATION_PORT_SPAN = 1000
"""The master port of generation g is the plan's base port + g mod this span."""
RUN_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""A run's name (node.rl.wire.RUN_PATTERN, which checks it)."""


class RendezvousAnswer(WireRecord):
    """A training rendezvous of one local rank (node.training.rendezvous)."""

    rank: int | None
    world_size: int
    master_addr: str
    master_port: int
    backend: Literal["nccl", "gloo"]
    generation: int
    term: int | None = None
    plan_version: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    nnodes: int | None = None
    cuda_device: int | None = None


class RendezvousQuery(BaseModel):
    local_rank: int = Field(
        default=0, ge=0, description="the local rank (training group; default 0)"
    )
    group: Literal["training", "weights"] = Field(
        default="training", description="training or weights"
    )
    run: Annotated[str, Field(pattern=RUN_NAME)] | SkipJsonSchema[None] = unset(
        "the run, with group=weights"
    )


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """One process's part of the training group, as served by the daemon at
    GET /v1/rendezvous?local_rank=I.

    The group is node-major: `rank` is the GLOBAL rank (`rank_offset + local_rank`) of local
    rank `local_rank` of this node, which runs `local_world_size` processes and is training
    node `node_rank` of `nnodes`. `rank` is None when this node does not train under the
    current plan. `cuda_device` is the local rank's index within the node's
    CUDA_VISIBLE_DEVICES (None when the node owns no GPU). `generation` changes whenever the
    training group changes; `master_port` is the one rank 0 hosts the TCPStore on for this
    generation (chosen by the coordinator; this module relies on nothing else). The fields
    after `plan_version` have defaults so an older daemon's answer (one process per node)
    still parses.
    """

    rank: int | None
    world_size: int
    master_addr: str
    master_port: int
    backend: Backend
    generation: int
    term: int
    plan_version: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int | None = None
    nnodes: int = 0
    cuda_device: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "world_size",
            "generation",
            "term",
            "plan_version",
            "local_rank",
            "local_world_size",
            "nnodes",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise RendezvousError(f"rendezvous {name} must be an integer >= 0, not {value!r}")
        if self.backend not in ("nccl", "gloo"):
            raise RendezvousError(f"rendezvous backend {self.backend!r} must be 'nccl' or 'gloo'")
        if not isinstance(self.master_addr, str):
            raise RendezvousError(f"rendezvous master_addr {self.master_addr!r} is not a string")
        if not _is_int(self.master_port) or not 0 <= self.master_port < 65536:
            raise RendezvousError(f"rendezvous master_port {self.master_port!r} is not a port")
        if self.cuda_device is not None and (not _is_int(self.cuda_device) or self.cuda_device < 0):
            raise RendezvousError(f"rendezvous cuda_device {self.cuda_device!r} is not an index")
        if self.rank is None:
            return
        if not _is_int(self.rank) or not 0 <= self.rank < self.world_size:
            raise RendezvousError(f"rendezvous rank {self.rank!r} is not below {self.world_size}")
        if not self.master_addr or self.master_port == 0:
            raise RendezvousError("a rendezvous with a rank needs master_addr and master_port")
        if not self.local_rank < self.local_world_size <= self.world_size:
            raise RendezvousError(
                f"rendezvous local_rank {self.local_rank} must be below local_world_size "
                f"{self.local_world_size}, which is at most world_size {self.world_size}"
            )
        if self.node_rank is not None and (
            not _is_int(self.node_rank) or not 0 <= self.node_rank < self.nnodes
        ):
            raise RendezvousError(
                f"rendezvous node_rank {self.node_rank!r} is not below nnodes {self.nnodes}"
            )

    @property
    def store_prefix(self) -> str:
        return store_prefix(self.generation)

    def same_group(self, other: Rendezvous | None) -> bool:
        """True when `other` puts this node in the same group: generation, rank and master."""
        return other is not None and other.to_dict() | _FENCE == self.to_dict() | _FENCE

    def to_dict(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}

    @classmethod
    def from_dict(cls, data: object) -> Rendezvous:
        """The rendezvous of a JSON object; RendezvousError names the bad or missing field.
        Fields with a default may be absent (an older daemon's answer)."""
        if not isinstance(data, Mapping):
            raise RendezvousError(f"rendezvous must be a JSON object, not {type(data).__name__}")
        specs = fields(cls)
        missing = [s.name for s in specs if s.name not in data and s.default is MISSING]
        if missing:
            raise RendezvousError(f"rendezvous lacks {', '.join(missing)}")
        return cls(**{s.name: data[s.name] for s in specs if s.name in data})


_FENCE = {"term": 0, "plan_version": 0}
"""Overrides of the fields that do not change the group (a new plan, the same training set)."""


@dataclass(frozen=True, slots=True)
class NoRank:
    """The daemon's answer when this node has no training rank: HTTP status and its reason."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class DaemonEndpoint:
    """Where and how to ask the local daemon: its URL, the secret to sign with (None: unsigned)."""

    url: str
    secret: bytes | None = None
    node_id: str = "cli-trainer"
    timeout_s: float = 10.0


def store_prefix(generation: int) -> str:
    """The TCPStore key prefix of one generation: stale ranks never see a newer group's keys."""
    return f"shoal/gen{generation}"


def daemon_endpoint(
    daemon_url: str | None = None,
    secret_file: str | Path | None = None,
    node_id: str | None = None,
    env: Mapping[str, str] | None = None,
    timeouts: Timeouts | None = None,
) -> DaemonEndpoint:
    """The endpoint from arguments, else SHOAL_DAEMON_URL / SHOAL_P2P_PORT, SHOAL_SECRET_FILE
    and SHOAL_NODE_ID; without a URL, http://127.0.0.1:8770."""
    env = os.environ if env is None else env
    if daemon_url is None:
        port = env.get("SHOAL_P2P_PORT") or "8770"
        daemon_url = env.get(ENV_DAEMON_URL) or peer_url("127.0.0.1", port)
    if not daemon_url.startswith(("http://", "https://")):
        raise RendezvousError(f"daemon URL {daemon_url!r} must start with http:// or https://")
    secret_path = secret_file if secret_file is not None else env.get("SHOAL_SECRET_FILE")
    secret = read_secret_file(Path(secret_path)) if secret_path else None
    return DaemonEndpoint(
        url=daemon_url.rstrip("/"),
        secret=secret,
        node_id=node_id or env.get("SHOAL_NODE_ID") or "cli-trainer",
        timeout_s=(timeouts or Timeouts()).http_request_s,
    )


def fetch_rendezvous(
    endpoint: DaemonEndpoint, timeout_s: float | None = None, local_rank: int | None = None
) -> Rendezvous | NoRank:
    """One GET /v1/rendezvous of local rank `local_rank` (None: 0): the rendezvous, or NoRank
    on 404/409; RendezvousError otherwise (a local_rank outside the node's processes answers
    400). Local rank 0 is asked without a query, as an older daemon understands it."""
    path = RENDEZVOUS_PATH
    if local_rank is not None:
        if not _is_int(local_rank) or local_rank < 0:
            raise RendezvousError(f"local_rank {local_rank!r} must be an integer >= 0")
        if local_rank:
            path = f"{RENDEZVOUS_PATH}?local_rank={local_rank}"
    wait_s = endpoint.timeout_s if timeout_s is None else max(0.05, timeout_s)
    where = f"{endpoint.url}{path}"
    client = BlockingPeerClient(Identity(endpoint.secret, endpoint.node_id))
    try:
        answer = client.request("GET", endpoint.url, path, timeout_s=wait_s, check=False)
    except PeerRequestError as exc:
        cause = exc.reason.removeprefix("unreachable: ")
        raise RendezvousError(f"daemon at {where} is unreachable: {cause}") from exc
    body = answer.body
    if answer.status >= 400:
        reason = _error_reason(body)
        if answer.status in (404, 409):
            return NoRank(answer.status, reason)
        raise RendezvousError(f"{where} answered {answer.status}: {reason}")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise RendezvousError(f"{where} answered invalid JSON: {body[:200]!r}") from exc
    try:
        return Rendezvous.from_dict(data)
    except RendezvousError as exc:
        raise RendezvousError(f"{where} answered a bad rendezvous: {exc}") from exc


def rendezvous_for(
    plan: RolePlan | None, node_id: str, local_rank: int = 0, *, owns_gpus: bool = False
) -> Rendezvous | None:
    """The rendezvous of local rank `local_rank` of `node_id` under `plan`, or None without a
    plan. `owns_gpus`: the node owns GPUs, so local rank i uses CUDA device i (of its
    CUDA_VISIBLE_DEVICES).

    RendezvousError when the node trains and `local_rank` is not one of its local ranks. The
    master port moves with the generation (base + generation mod GENERATION_PORT_SPAN) so a new
    group's store never meets the previous group's socket.
    """
    if plan is None:
        return None
    if not _is_int(local_rank) or local_rank < 0:
        raise RendezvousError(f"local_rank {local_rank!r} must be an integer >= 0")
    group = plan.group
    port = group.master_port
    if group.world_size:
        port = group.master_port + plan.generation % GENERATION_PORT_SPAN
    node_rank = plan.node_rank_of(node_id)
    offset = plan.rank_offset_of(node_id)
    local_world_size = plan.local_world_size_of(node_id)
    if node_rank is not None and local_rank >= local_world_size:
        raise RendezvousError(
            f"local_rank {local_rank} is not one of this node's local ranks "
            f"0..{local_world_size - 1} (it runs {local_world_size} training processes)"
        )
    trains = offset is not None
    return Rendezvous(
        rank=offset + local_rank if offset is not None else None,
        world_size=group.world_size,
        master_addr=group.master_addr,
        master_port=port,
        backend=group.backend,
        generation=plan.generation,
        term=plan.term,
        plan_version=plan.version,
        local_rank=local_rank,
        local_world_size=local_world_size if trains else 0,
        node_rank=node_rank,
        nnodes=len(plan.training_ranks),
        cuda_device=local_rank if trains and owns_gpus else None,
    )


def _error_reason(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace") or "no reason given"
    if isinstance(data, Mapping):
        return str(data.get("reason") or data.get("error") or data)
    return str(data)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
