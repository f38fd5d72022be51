"""The weights group of a plan as one node sees it: members, ranks, the publisher's store port,
and the receivers' daemon URLs; served at GET /v1/rendezvous?group=weights&run=R."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

from node.errors import PeerRequestError, RendezvousError, WeightsError
from node.plan import RolePlan
from node.rl.client import call
from node.training.rendezvous import GENERATION_PORT_SPAN, DaemonEndpoint
from shoal.group import gloo_bound_to_route

WEIGHTS_GROUP = "weights"
RUN_PORT_SPAN = 1000
"""The publisher of run R hosts its store at the plan's base port + GENERATION_PORT_SPAN +
crc32(R) mod this span: above every training generation's port, one port per run."""


class RendezvousJson(TypedDict):
    """A run's weights group as GET /v1/rendezvous answers it (WeightsRendezvous.to_dict)."""

    group: str
    run: str
    rank: int | None
    world_size: int
    members: list[str]
    urls: dict[str, str]
    master_addr: str
    master_port: int
    backend: str
    generation: int
    term: int
    plan_version: int


@dataclass(frozen=True, slots=True)
class WeightsRendezvous:
    """The weights group of one run: `members[0]` publishes; `urls` maps each member to its
    daemon's URL; `rank` is this node's index in members, or None."""

    run: str
    rank: int | None
    members: tuple[str, ...]
    urls: Mapping[str, str]
    master_addr: str
    master_port: int
    backend: str
    generation: int
    term: int
    plan_version: int

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def publisher(self) -> str | None:
        return self.members[0] if self.members else None

    @property
    def receivers(self) -> tuple[str, ...]:
        return self.members[1:]

    def to_dict(self) -> RendezvousJson:
        return RendezvousJson(
            group=WEIGHTS_GROUP,
            run=self.run,
            rank=self.rank,
            world_size=self.world_size,
            members=list(self.members),
            urls=dict(self.urls),
            master_addr=self.master_addr,
            master_port=self.master_port,
            backend=self.backend,
            generation=self.generation,
            term=self.term,
            plan_version=self.plan_version,
        )

    @classmethod
    def from_dict(cls, data: object) -> WeightsRendezvous:
        """RendezvousError names a missing or malformed field."""
        if not isinstance(data, Mapping):
            raise RendezvousError(
                f"weights rendezvous must be an object, not {type(data).__name__}"
            )
        try:
            rank = data["rank"]
            result = cls(
                run=str(data["run"]),
                rank=None if rank is None else int(rank),
                members=tuple(str(m) for m in data["members"]),
                urls={str(k): str(v) for k, v in dict(data["urls"]).items()},
                master_addr=str(data["master_addr"]),
                master_port=int(data["master_port"]),
                backend=str(data["backend"]),
                generation=int(data["generation"]),
                term=int(data["term"]),
                plan_version=int(data["plan_version"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousError(f"weights rendezvous is malformed: {exc!r}") from exc
        return result


def weights_port(base_port: int, run: str) -> int:
    """The port the publisher of `run` hosts its store on (see RUN_PORT_SPAN)."""
    return base_port + GENERATION_PORT_SPAN + zlib.crc32(run.encode()) % RUN_PORT_SPAN


def weights_rendezvous_for(
    plan: RolePlan | None,
    node_id: str,
    run: str,
    url_of: Callable[[str], str | None],
) -> WeightsRendezvous | None:
    """This node's view of the weights group of `run` under `plan`; None without a plan.
    Members whose address is unknown (`url_of` answers None) are left out."""
    if plan is None:
        return None
    members = tuple(m for m in plan.weights_members() if m == node_id or url_of(m) is not None)
    if plan.training_ranks and (not members or members[0] != plan.training_ranks[0]):
        members = ()
    urls = {m: url for m in members if (url := url_of(m)) is not None}
    return WeightsRendezvous(
        run=run,
        rank=members.index(node_id) if node_id in members else None,
        members=members,
        urls=urls,
        master_addr=plan.group.master_addr,
        master_port=weights_port(plan.group.master_port, run) if members else 0,
        backend=plan.group.backend,
        generation=plan.weights_generation,
        term=plan.term,
        plan_version=plan.version,
    )


@dataclass(frozen=True, slots=True)
class TensorDevice:
    """Where one member's weights live: `kind` "cuda" (with the GPU's UUID when torch knows
    it) or "cpu" (also: parameters spread over several devices). Receivers send it in their
    ready key; the publisher picks the group's backend from every member's."""

    kind: str
    uuid: str | None = None

    def to_json(self) -> str:
        return json.dumps({"device": {"kind": self.kind, "uuid": self.uuid}})

    @classmethod
    def from_ready(cls, value: bytes | str) -> TensorDevice | None:
        """The device in a ready key's value; None for the previous release's "1" or anything
        malformed (the publisher then uses gloo)."""
        try:
            found = json.loads(value)["device"]
            kind, uuid = found["kind"], found.get("uuid")
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(kind, str) or not (uuid is None or isinstance(uuid, str)):
            return None
        return cls(kind, uuid)


def device_of(model: Any) -> TensorDevice:
    """The device of `model`'s parameters: CUDA with its UUID when all are on one CUDA device,
    "cpu" otherwise (CPU tensors, no parameters, or several devices)."""
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        return TensorDevice("cpu")
    (device,) = devices
    if device.type != "cuda":
        return TensorDevice("cpu")
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (RuntimeError, AttributeError, AssertionError):
        uuid = None
    return TensorDevice("cuda", uuid or None)


def weights_backend(
    publisher: TensorDevice, receivers: Sequence[TensorDevice | None], nccl_available: bool
) -> str:
    """The weights group's backend: "nccl" when NCCL is built in and the publisher's and every
    receiver's weights are on CUDA devices with known, pairwise distinct UUIDs (NCCL refuses
    two ranks on one GPU); "gloo" otherwise, also when any device is unknown."""
    members = [publisher, *receivers]
    if not nccl_available or not receivers:
        return "gloo"
    uuids = [m.uuid if m is not None and m.kind == "cuda" else None for m in members]
    if any(uuid is None for uuid in uuids) or len(set(uuids)) != len(uuids):
        return "gloo"
    return "nccl"


def new_weights_group(
    backend: str, store: Any, rank: int, size: int, timeout: timedelta, master_addr: str
) -> Any:
    """A weights process group of `backend` ("gloo" or "nccl") on `store`; RuntimeError from
    torch when it does not form."""
    import torch.distributed as dist

    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    with gloo_bound_to_route(master_addr):
        return dist.ProcessGroupGloo(store, rank, size, timeout)


def store_key_prefix(run: str) -> str:
    return f"shoal/weights/{run}"


def fetch_weights_rendezvous(
    endpoint: DaemonEndpoint, run: str, timeout_s: float | None = None
) -> WeightsRendezvous:
    """GET /v1/rendezvous?group=weights&run=R of the local daemon; WeightsError when refused."""
    try:
        _, body = call(
            endpoint, "GET", f"/v1/rendezvous?group=weights&run={run}", timeout_s=timeout_s
        )
    except PeerRequestError as exc:
        raise WeightsError(f"no weights group for run {run!r}: {exc}") from exc
    return WeightsRendezvous.from_dict(body)
