"""Role plans as data: the plan a coordinator publishes, its (term, version) fence, and the rules
that say which plan a node applies and which requests it refuses as stale."""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NotRequired, TypedDict, TypeGuard

from config import Role
from node.errors import PlanError

Backend = Literal["nccl", "gloo"]


class GroupJson(TypedDict):
    master_addr: str
    master_port: int
    world_size: int
    backend: Backend


class AssignmentJson(TypedDict):
    """What a plan assigns (its digest is of this); `restart` only when set."""

    roles: dict[str, str]
    training_ranks: list[str]
    local_world_sizes: list[int]
    group: GroupJson
    generation: int
    cannot_train: dict[str, str]
    weights_generation: int
    draining: dict[str, float | None]
    quarantined: dict[str, str]
    restart: NotRequired[str]


class RolePlanJson(AssignmentJson):
    """A plan as JSON: `term` and `version` first, the assignment, then `note`."""

    term: int
    version: int
    note: str


FENCE_HEADER = "X-Shoal-Fence"
"""HTTP header carrying the fence of a role-dependent request, as `term.version`."""

_PLAN_ROLES = frozenset({Role.TRAINING, Role.INFERENCE, Role.SELFPLAY})


@dataclass(frozen=True, order=True, slots=True)
class PlanFence:
    """The (term, version) of a plan; plans and fences are ordered by term, then version."""

    term: int
    version: int

    def __post_init__(self) -> None:
        if not (_is_int(self.term) and _is_int(self.version)) or self.term < 0 or self.version < 0:
            raise PlanError(f"fence ({self.term!r}, {self.version!r}) needs two integers >= 0")

    def to_header(self) -> str:
        return f"{self.term}.{self.version}"

    @classmethod
    def from_header(cls, text: str) -> PlanFence:
        """Parse `term.version` (the FENCE_HEADER value); PlanError when malformed."""
        term, dot, version = text.strip().partition(".")
        if not dot or not term.isdigit() or not version.isdigit():
            raise PlanError(f"fence {text!r} is not 'term.version'")
        return cls(int(term), int(version))

    def to_list(self) -> list[int]:
        return [self.term, self.version]

    @classmethod
    def from_value(cls, value: object) -> PlanFence | None:
        """A fence from its JSON form `[term, version]`, or None for JSON null."""
        if value is None:
            return None
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise PlanError(f"fence {value!r} must be [term, version]")
        return cls(value[0], value[1])


FenceLike = PlanFence | tuple[int, int]


@dataclass(frozen=True, slots=True)
class RestartRequest:
    """Restart the training group of `generation` (a new generation, the same nodes) because
    of `reason` (`hang`, `worker_exit`): what node.training asks of the coordinator."""

    generation: int
    reason: str


def as_fence(value: FenceLike) -> PlanFence:
    return value if isinstance(value, PlanFence) else PlanFence(value[0], value[1])


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """The training group a plan forms: rank 0's address and base port, the world size, the
    backend. Each node's own view of it is a `node.training.rendezvous.Rendezvous`.

    world_size 0 means nobody trains; master_addr is then the empty string.
    """

    master_addr: str
    master_port: int
    world_size: int
    backend: Backend

    def to_dict(self) -> GroupJson:
        return {
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "world_size": self.world_size,
            "backend": self.backend,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupSpec:
        backend = data.get("backend")
        if backend not in ("nccl", "gloo"):
            raise PlanError(f"group backend {backend!r} must be 'nccl' or 'gloo'")
        addr, port, size = data.get("master_addr"), data.get("master_port"), data.get("world_size")
        if not isinstance(addr, str) or not _is_int(port) or not _is_int(size) or size < 0:
            raise PlanError(f"group {dict(data)!r} is malformed")
        return cls(addr, port, size, backend)


@dataclass(frozen=True, slots=True)
class RolePlan:
    """What every node does under one (term, version): roles, training ranks and group.

    The training group is node-major: `training_ranks[k]` is training node k (node rank k),
    which runs `local_world_sizes[k]` processes (local ranks 0..n-1) holding the global ranks
    `rank_offset_of(node) + local_rank`; the group's world size is their sum, and the node of
    node rank 0 hosts the master (global rank 0). An empty `local_world_sizes` (and a plan dict
    without the field, an older release's) means one process per training node.

    `generation` is the coordinator's counter of training groups: it stays while ranks, local
    world sizes and group stay, and otherwise rises above every generation the coordinator has
    seen, across failovers. `cannot_train` names the members that may not train, with the
    reason (they reported it, or a GPU they claim is another node's). `note` says
    why in words (for example why nobody trains). `weights_generation` counts the weights groups
    (training rank 0 and every inference/selfplay node, see node.rl.group): it rises whenever
    that set or its master changes. `draining` maps each node an operator drains (`shoal node
    drain`) to the seconds after which its running jobs are killed (None: they finish): such a
    node gets no training rank, no weights-group place, no new job, gang member or actor. A plan
    dict without the field (an older release's) drains nobody. `quarantined` maps each node
    quarantined for a GPU fault (node.quarantine) to its reason (`gpu_fault: Xid 79 on GPU-...`,
    also its `cannot_train` while it is a member): it gets no training rank and no weights-group
    place; a plan dict without the field quarantines nobody. A node in the training ranks of one
    plan and quarantined in the next left the group for a GPU fault. `restart` says why the
    coordinator forced this generation (a RestartRequest's reason: hang, worker_exit), empty when
    it did not (an older release's plan has none).
    """

    term: int
    version: int
    roles: Mapping[str, Role]
    training_ranks: tuple[str, ...]
    group: GroupSpec
    note: str = ""
    generation: int = 0
    cannot_train: Mapping[str, str] = field(default_factory=dict)
    weights_generation: int = 0
    local_world_sizes: tuple[int, ...] = ()
    draining: Mapping[str, float | None] = field(default_factory=dict)
    quarantined: Mapping[str, str] = field(default_factory=dict)
    restart: str = ""
    _digest: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        PlanFence(self.term, self.version)
        roles = MappingProxyType(dict(sorted(self.roles.items())))
        if any(role not in _PLAN_ROLES for role in roles.values()):
            raise PlanError("a plan assigns only training, inference or selfplay")
        training = {node for node, role in roles.items() if role is Role.TRAINING}
        if set(self.training_ranks) != training or len(self.training_ranks) != len(training):
            raise PlanError("training_ranks must list each training node exactly once")
        sizes = tuple(self.local_world_sizes) or (1,) * len(self.training_ranks)
        if len(sizes) != len(self.training_ranks):
            raise PlanError(
                f"local_world_sizes has {len(sizes)} entries for "
                f"{len(self.training_ranks)} training nodes; it needs one per training node"
            )
        if not all(_is_int(size) and size >= 1 for size in sizes):
            raise PlanError(f"local_world_sizes {list(sizes)!r} must be integers >= 1")
        if self.group.world_size != sum(sizes):
            raise PlanError(
                f"group world_size {self.group.world_size} must equal the sum of "
                f"local_world_sizes ({sum(sizes)})"
            )
        if not _is_int(self.generation) or self.generation < 0:
            raise PlanError(f"plan generation {self.generation!r} must be an integer >= 0")
        if not _is_int(self.weights_generation) or self.weights_generation < 0:
            raise PlanError(
                f"plan weights_generation {self.weights_generation!r} must be an integer >= 0"
            )
        unable = MappingProxyType(dict(sorted(self.cannot_train.items())))
        if set(unable) & training:
            raise PlanError("a node that cannot train has no training rank")
        draining = MappingProxyType(dict(sorted(self.draining.items())))
        if set(draining) & training:
            raise PlanError("a draining node has no training rank")
        for node, after_s in draining.items():
            if after_s is not None and (
                isinstance(after_s, bool)
                or not isinstance(after_s, int | float)
                or not 0 <= after_s < float("inf")
            ):
                raise PlanError(
                    f"draining {node!r}: kill_after_s {after_s!r} must be a number >= 0 or null"
                )
        quarantined = MappingProxyType(dict(sorted(self.quarantined.items())))
        if set(quarantined) & training:
            raise PlanError("a quarantined node has no training rank")
        if not all(isinstance(reason, str) for reason in quarantined.values()):
            raise PlanError("plan quarantined must map node ids to reasons")
        object.__setattr__(self, "quarantined", quarantined)
        object.__setattr__(self, "draining", draining)
        object.__setattr__(self, "cannot_train", unable)
        object.__setattr__(self, "roles", roles)
        object.__setattr__(self, "training_ranks", tuple(self.training_ranks))
        object.__setattr__(self, "local_world_sizes", sizes)
        object.__setattr__(self, "_digest", _hash_assignment(self._assignment()))

    @property
    def fence(self) -> PlanFence:
        return PlanFence(self.term, self.version)

    @property
    def digest(self) -> str:
        """Hash of the assignment (roles, ranks, local world sizes, group, generation, who
        cannot train, who drains, who is quarantined), independent of term and version."""
        return self._digest

    def role_of(self, node_id: str) -> Role | None:
        return self.roles.get(node_id)

    def rank_of(self, node_id: str) -> int | None:
        """The node rank of `node_id` (its place in `training_ranks`), or None when it does not
        train; the same as `node_rank_of`. Its processes' global ranks: `rank_offset_of`."""
        return self.node_rank_of(node_id)

    def node_rank_of(self, node_id: str) -> int | None:
        """The place of `node_id` among the training nodes (GROUP_RANK), or None."""
        try:
            return self.training_ranks.index(node_id)
        except ValueError:
            return None

    def rank_offset_of(self, node_id: str) -> int | None:
        """The global rank of `node_id`'s local rank 0, or None when it does not train."""
        node_rank = self.node_rank_of(node_id)
        if node_rank is None:
            return None
        return sum(self.local_world_sizes[:node_rank])

    def local_world_size_of(self, node_id: str) -> int:
        """How many processes `node_id` runs in the training group (0 when it does not train)."""
        node_rank = self.node_rank_of(node_id)
        return 0 if node_rank is None else self.local_world_sizes[node_rank]

    def is_draining(self, node_id: str) -> bool:
        """Whether an operator drains `node_id` (no new work goes there)."""
        return node_id in self.draining

    def quarantined_trainers(self, previous: RolePlan | None) -> tuple[str, ...]:
        """The training nodes of `previous` that this plan quarantines: when any, this plan's
        new training group is a restart for a GPU fault (`gpu_fault`)."""
        ranks = () if previous is None else previous.training_ranks
        return tuple(node for node in ranks if node in self.quarantined)

    def weights_members(self) -> tuple[str, ...]:
        """The weights group: training rank 0 (the publisher), then every inference and selfplay
        node by id that is neither draining nor quarantined; empty when nobody trains."""
        return weights_members(self.roles, self.training_ranks, self.draining, self.quarantined)

    def same_assignment(self, other: RolePlan | None) -> bool:
        """True when `other` assigns the same roles, ranks, local world sizes, group and
        generation (any fence)."""
        return other is not None and other.digest == self.digest

    def _assignment(self) -> AssignmentJson:
        assignment: AssignmentJson = {
            "roles": {node: role.value for node, role in self.roles.items()},
            "training_ranks": list(self.training_ranks),
            "local_world_sizes": list(self.local_world_sizes),
            "group": self.group.to_dict(),
            "generation": self.generation,
            "cannot_train": dict(self.cannot_train),
            "weights_generation": self.weights_generation,
            "draining": dict(self.draining),
            "quarantined": dict(self.quarantined),
        }
        if self.restart:
            assignment["restart"] = self.restart
        return assignment

    def to_dict(self) -> RolePlanJson:
        return {"term": self.term, "version": self.version, **self._assignment(), "note": self.note}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolePlan:
        """The plan of a JSON object; PlanError names what is wrong."""
        if not isinstance(data, Mapping):
            raise PlanError(f"plan must be an object, not {type(data).__name__}")
        try:
            roles_raw = data["roles"]
            ranks = data["training_ranks"]
            group = data["group"]
            term, version = data["term"], data["version"]
        except KeyError as exc:
            raise PlanError(f"plan lacks {exc.args[0]!r}") from exc
        if not isinstance(roles_raw, Mapping) or not isinstance(ranks, list):
            raise PlanError("plan roles must be an object and training_ranks a list")
        if not isinstance(group, Mapping):
            raise PlanError("plan group must be an object")
        unable = data.get("cannot_train", {})
        if not isinstance(unable, Mapping) or not all(
            isinstance(reason, str) for reason in unable.values()
        ):
            raise PlanError("plan cannot_train must map node ids to reasons")
        try:
            roles = {str(node): Role(role) for node, role in roles_raw.items()}
        except ValueError as exc:
            raise PlanError(f"plan has an unknown role: {exc}") from exc
        sizes = data.get("local_world_sizes")
        if sizes is not None and not isinstance(sizes, list):
            raise PlanError("plan local_world_sizes must be a list of integers")
        draining = data.get("draining") or {}
        if not isinstance(draining, Mapping):
            raise PlanError("plan draining must map node ids to kill_after_s (a number or null)")
        quarantined = data.get("quarantined") or {}
        if not isinstance(quarantined, Mapping):
            raise PlanError("plan quarantined must map node ids to reasons")
        note, restart = data.get("note", ""), data.get("restart", "")
        return cls(
            term=term,
            version=version,
            roles=roles,
            training_ranks=tuple(str(node) for node in ranks),
            group=GroupSpec.from_dict(group),
            note=note if isinstance(note, str) else "",
            generation=data.get("generation", 0),
            cannot_train={str(node): reason for node, reason in unable.items()},
            weights_generation=data.get("weights_generation", 0),
            local_world_sizes=tuple(sizes or ()),
            draining={str(node): after_s for node, after_s in draining.items()},
            quarantined={str(node): reason for node, reason in quarantined.items()},
            restart=restart if isinstance(restart, str) else "",
        )


def weights_members(
    roles: Mapping[str, Role],
    training_ranks: tuple[str, ...],
    draining: Mapping[str, object],
    quarantined: Mapping[str, object],
) -> tuple[str, ...]:
    """`RolePlan.weights_members` of a plan with these roles, ranks, drains and quarantines."""
    if not training_ranks:
        return ()
    receivers = sorted(
        n
        for n, r in roles.items()
        if r in (Role.INFERENCE, Role.SELFPLAY) and n not in draining and n not in quarantined
    )
    return (training_ranks[0], *receivers)


def should_apply(current: FenceLike | None, incoming: FenceLike) -> bool:
    """True when a plan fenced `incoming` is strictly newer than the applied `current`."""
    return current is None or as_fence(incoming) > as_fence(current)


class FenceVerdict(enum.StrEnum):
    """How a presented fence compares with the plan this node applies."""

    CURRENT = "current"
    STALE = "stale"
    AHEAD = "ahead"
    MISSING = "missing"
    NO_PLAN = "no_plan"


@dataclass(frozen=True, slots=True)
class FenceResult:
    """The answer to a fenced request: `ok`, else HTTP `status` 409 with a `reason`."""

    verdict: FenceVerdict
    current: PlanFence | None
    presented: PlanFence | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.verdict is FenceVerdict.CURRENT

    @property
    def status(self) -> int:
        return 200 if self.ok else 409

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "current": None if self.current is None else self.current.to_list(),
            "presented": None if self.presented is None else self.presented.to_list(),
            "reason": self.reason,
        }


def check_fence(current: FenceLike | None, presented: FenceLike | None) -> FenceResult:
    """Accept a role-dependent request only under exactly the plan this node applies.

    Older fences are stale (the sender acts on a superseded plan); newer ones are refused too
    (this node has not applied that plan yet; the sender retries once it has).
    """
    now = None if current is None else as_fence(current)
    shown = None if presented is None else as_fence(presented)
    if shown is None:
        return FenceResult(FenceVerdict.MISSING, now, None, "request carries no plan fence")
    if now is None:
        return FenceResult(FenceVerdict.NO_PLAN, None, shown, "this node has applied no plan yet")
    if shown < now:
        reason = f"fence {shown.to_header()} is stale; this node applies {now.to_header()}"
        return FenceResult(FenceVerdict.STALE, now, shown, reason)
    if shown > now:
        reason = f"fence {shown.to_header()} is ahead of this node's {now.to_header()}; retry"
        return FenceResult(FenceVerdict.AHEAD, now, shown, reason)
    return FenceResult(FenceVerdict.CURRENT, now, shown, "current")


def _hash_assignment(assignment: AssignmentJson) -> str:
    text = json.dumps(assignment, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
