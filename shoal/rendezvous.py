"""Where this process's training group meets: read from torchrun's environment (what the shoal
launcher and torchrun give their workers), else asked of the local daemon
(GET /v1/rendezvous?local_rank=N, the answer of node.training.rendezvous, which a contract test
compares with this parser)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from shoal._daemon import DaemonClient
from shoal.errors import DaemonAnswerError, GroupError, ShoalError
from shoal.place import RankPlace, place_from_env

__all__ = ["Rendezvous", "fetch_rendezvous", "rendezvous_from_env", "store_prefix"]

Backend = Literal["nccl", "gloo"]
RENDEZVOUS_PATH = "/v1/rendezvous"


def store_prefix(generation: int, attempt: int = 0) -> str:
    """The store key prefix of one generation (and restart attempt, under torchrun's own store):
    a stale rank never meets a newer group's keys. The daemon's groups use the same."""
    prefix = f"shoal/gen{generation}"
    return prefix if not attempt else f"{prefix}/attempt{attempt}"


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """One process's place in one generation's group, and where rank 0 hosts its store.

    `host_store`: rank 0 hosts the TCPStore itself (shoal's groups); False under torchrun's
    agent, whose store every worker joins as a client (TORCHELASTIC_USE_AGENT_STORE=True).
    `backend` None: nccl where CUDA is available, else gloo. `cuda_device` None: the local rank.
    """

    place: RankPlace
    master_addr: str
    master_port: int
    backend: Backend | None = None
    host_store: bool = True
    attempt: int = 0
    cuda_device: int | None = None

    @property
    def generation(self) -> int:
        return self.place.generation

    @property
    def store_prefix(self) -> str:
        return store_prefix(self.place.generation, self.attempt)


def _backend(value: object, where: str) -> Backend | None:
    if value in (None, ""):
        return None
    if value == "nccl":
        return "nccl"
    if value == "gloo":
        return "gloo"
    raise GroupError(f"{where}: backend {value!r} must be nccl or gloo")


def rendezvous_from_env(env: Mapping[str, str]) -> Rendezvous | None:
    """The rendezvous torchrun's variables give (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    ...; SHOAL_BACKEND where the shoal launcher set it), or None when RANK or WORLD_SIZE is
    unset (not started by torchrun or shoal)."""
    if not env.get("RANK") or not env.get("WORLD_SIZE"):
        return None
    place = place_from_env(env)
    address, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if not address or not port.isdigit():
        raise ShoalError(
            f"MASTER_ADDR={address!r} MASTER_PORT={port!r}: torchrun's variables are incomplete"
        )
    restarts = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Rendezvous(
        place=place,
        master_addr=address,
        master_port=int(port),
        backend=_backend(env.get("SHOAL_BACKEND"), "SHOAL_BACKEND"),
        host_store=env.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
        attempt=int(restarts) if restarts.isdigit() else 0,
    )


def _field(answer: Mapping[str, object], name: str, default: int | None = None) -> int:
    value = answer.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GroupError(f"the daemon's rendezvous has {name}={value!r}, not an integer")
    return value


def parse_rendezvous(answer: object, node_id: str | None = None) -> Rendezvous | None:
    """The daemon's GET /v1/rendezvous answer as a Rendezvous; None when this node has no rank
    under the current plan. GroupError names a malformed field."""
    if not isinstance(answer, Mapping):
        raise GroupError(f"the daemon's rendezvous is not a JSON object: {answer!r:.200}")
    if answer.get("rank") is None:
        return None
    address = answer.get("master_addr")
    if not isinstance(address, str) or not address:
        raise GroupError(f"the daemon's rendezvous has master_addr={address!r}")
    device = answer.get("cuda_device")
    try:
        place = RankPlace(
            rank=_field(answer, "rank"),
            local_rank=_field(answer, "local_rank", 0),
            world_size=_field(answer, "world_size"),
            local_world_size=_field(answer, "local_world_size", 1),
            generation=_field(answer, "generation"),
            node_id=node_id,
        )
    except ShoalError as exc:
        raise GroupError(f"the daemon's rendezvous is inconsistent: {exc}") from None
    return Rendezvous(
        place=place,
        master_addr=address,
        master_port=_field(answer, "master_port"),
        backend=_backend(answer.get("backend"), "the daemon's rendezvous"),
        cuda_device=device if isinstance(device, int) and not isinstance(device, bool) else None,
    )


def fetch_rendezvous(
    client: DaemonClient, local_rank: int, timeout_s: float, node_id: str | None = None
) -> Rendezvous | None:
    """One GET /v1/rendezvous of `local_rank`: the rendezvous, or None while this node has no
    rank (404/409: no plan yet, or no rank for it). Other answers raise DaemonAnswerError;
    DaemonUnreachableError when the daemon does not answer."""
    path = RENDEZVOUS_PATH if not local_rank else f"{RENDEZVOUS_PATH}?local_rank={local_rank}"
    try:
        answer = client.request("GET", path, timeout_s=timeout_s)
    except DaemonAnswerError as exc:
        if exc.status in (404, 409):
            return None
        raise
    return parse_rendezvous(answer, node_id)
