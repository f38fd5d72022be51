"""Which node does what: the pure rule that turns members' capabilities into a role plan, and
the debouncer that turns a burst of membership changes into one new plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from config import HostEntry, Role
from node.election.claims import gpu_conflicts, gpu_uuids_from_meta
from node.errors import PlanError
from node.plan import Backend, GroupSpec, RestartRequest, RolePlan, weights_members

BackendChoice = Literal["nccl", "gloo", "auto"]
AUTO_FALLBACK_ROLE = Role.SELFPLAY
"""What an `auto` node that does not train does: self-play (it generates the training data)."""
CANNOT_TRAIN_META = "cannot_train"
"""Membership meta key a node sets, with its reason, while it cannot train (its training
process keeps dying); the coordinator gives such a node no rank."""
NPROC_META = "training_nproc"
"""Membership meta key of the processes a node runs in the training group (absent: 1)."""


@dataclass(frozen=True, slots=True)
class NodeCapabilities:
    """What the coordinator knows of one alive member. `gpu_vram_gb` is per GPU;
    `cannot_train` is the member's reason when it reported itself unable to train;
    `gpu_uuids` are the GPUs it owns (no two training nodes may share one); `nproc` is how
    many processes it runs in the training group."""

    node_id: str
    address: str
    gpu_count: int = 0
    gpu_type: str | None = None
    gpu_vram_gb: float = 0.0
    preference: Role = Role.AUTO
    cannot_train: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    nproc: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or self.nproc < 1:
            raise PlanError(f"member {self.node_id!r}: nproc {self.nproc!r} must be >= 1")


@dataclass(frozen=True, slots=True)
class RolePolicy:
    """Bounds and knobs of role assignment.

    Fewer than `min_training` possible trainers means nobody trains. `prefer_vram` orders `auto`
    nodes by VRAM per GPU before GPU count (False: GPU count first). `backend` "auto" picks nccl
    when every training node has a GPU, else gloo; under "gloo", GPU-less `auto` nodes may train;
    under "nccl", GPU-less nodes never train.
    """

    min_training: int
    max_training: int
    prefer_vram: bool = True
    master_port: int = 29500
    backend: BackendChoice = "auto"

    def __post_init__(self) -> None:
        if not 0 <= self.min_training <= self.max_training:
            raise PlanError(
                f"role policy needs 0 <= min_training ({self.min_training}) "
                f"<= max_training ({self.max_training})"
            )
        if not 0 < self.master_port < 65536:
            raise PlanError(f"role policy master_port {self.master_port} is not in 1..65535")
        if self.backend not in ("nccl", "gloo", "auto"):
            raise PlanError(f"role policy backend {self.backend!r} is not nccl, gloo or auto")


def compute_plan(
    term: int,
    version: int,
    members: Sequence[NodeCapabilities],
    policy: RolePolicy,
    previous: RolePlan | None = None,
    highest_generation: int = 0,
    draining: Mapping[str, float | None] | None = None,
    quarantined: Mapping[str, str] | None = None,
    restart: RestartRequest | None = None,
) -> RolePlan:
    """The plan (term, version) for `members` under `policy`.

    Training goes first to nodes that prefer it, then to `auto` nodes with the most VRAM per
    GPU (then most GPUs, then node id), up to max_training; `auto` nodes that do not train do
    self-play, inference and selfplay preferences are kept.

    A member that claims a GPU UUID an earlier member (by node id) claims too may not train:
    its `cannot_train` says `GPU <uuid> is also claimed by <node>`, so no two ranks share a GPU.

    Deterministic in its inputs (member order does not matter). With `previous`, training nodes
    that survive keep their relative rank order and come first; newcomers follow in choice order.
    The group is node-major: training node k runs its `nproc` processes; world_size is their sum.
    The generation comes from `next_generation(ranks, group, previous, highest_generation,
    local_world_sizes)`.

    `draining` (node id -> kill_after_s, from `shoal node drain`; None: the previous plan's, an
    empty mapping: nobody) is copied into the plan; a draining member keeps its non-training
    role but takes no training rank, so its rank moves to another node in this plan; its GPUs
    do not count as claimed (another node of its host may train on them).

    `quarantined` (node id -> reason, GPU faults kept in the lock table; None: the previous
    plan's) is copied into the plan; a quarantined member takes no training rank and its reason
    is its `cannot_train`.

    `restart` (node.training: the group hung, a worker exited) forces a generation above the
    previous plan's when it names the previous plan's generation, and the plan's `restart` says
    why; a generation that stays keeps its reason; a stale request changes nothing.
    """
    drains = dict(draining if draining is not None else previous.draining if previous else {})
    held = quarantined if quarantined is not None else previous.quarantined if previous else {}
    by_id = _with_gpu_conflicts(_by_id(members), drains, held)
    chosen = _choose_trainers([cap for cap in by_id.values() if cap.node_id not in drains], policy)
    eligible = len(chosen)
    if eligible < policy.min_training:
        chosen = []
    ranks = _stable_ranks(chosen, previous)
    roles = {node_id: _non_training_role(cap) for node_id, cap in by_id.items()}
    roles.update(dict.fromkeys(ranks, Role.TRAINING))
    sizes = tuple(by_id[node].nproc for node in ranks)
    group = _group_of(ranks, sizes, by_id, policy)
    generation = next_generation(tuple(ranks), group, previous, highest_generation, sizes)
    generation, reason = _restarted(generation, previous, highest_generation, restart)
    receivers = weights_members(roles, tuple(ranks), drains, held)
    return RolePlan(
        term=term,
        version=version,
        roles=roles,
        training_ranks=tuple(ranks),
        group=group,
        note=_note(eligible, len(ranks), by_id, policy) + _out_note(drains, held),
        generation=generation,
        restart=reason,
        cannot_train={
            node_id: cap.cannot_train for node_id, cap in by_id.items() if cap.cannot_train
        },
        weights_generation=_weights_generation(receivers, group.master_addr, previous),
        local_world_sizes=sizes,
        draining=drains,
        quarantined=held,
    )


def _group_of(
    ranks: Sequence[str],
    sizes: tuple[int, ...],
    by_id: Mapping[str, NodeCapabilities],
    policy: RolePolicy,
) -> GroupSpec:
    """The training group of `ranks` (node-major, `sizes` processes each): its master is node
    rank 0."""
    return GroupSpec(
        master_addr=by_id[ranks[0]].address if ranks else "",
        master_port=policy.master_port,
        world_size=sum(sizes),
        backend=_resolve_backend(policy.backend, [by_id[node] for node in ranks]),
    )


def _out_note(drains: Mapping[str, float | None], held: Mapping[str, str]) -> str:
    """What the plan's note adds for the drained and the quarantined nodes."""
    drained = f"; draining: {', '.join(sorted(drains))}" if drains else ""
    return drained + (f"; quarantined: {', '.join(sorted(held))}" if held else "")


def _restarted(
    generation: int,
    previous: RolePlan | None,
    highest_generation: int,
    restart: RestartRequest | None,
) -> tuple[int, str]:
    """The generation and its `restart` reason: above every one seen when `restart` names the
    previous plan's generation; else the previous plan's reason while its generation stays."""
    if restart is not None and previous is not None and restart.generation == previous.generation:
        return max(generation, highest_generation + 1, previous.generation + 1), restart.reason
    kept = previous is not None and previous.generation == generation
    return generation, previous.restart if kept and previous is not None else ""


def _with_gpu_conflicts(
    by_id: Mapping[str, NodeCapabilities],
    drains: Mapping[str, float | None],
    held: Mapping[str, str],
) -> dict[str, NodeCapabilities]:
    """The members, each that claims a GPU an earlier member (by id) claims marked
    `cannot_train`, and each quarantined one (`held`) with its reason; a draining member's
    GPUs count as unclaimed."""
    conflicts = gpu_conflicts(
        {node_id: cap.gpu_uuids for node_id, cap in by_id.items() if node_id not in drains}
    )
    conflicts.update({node_id: held[node_id] for node_id in by_id if node_id in held})
    return {
        node_id: replace(cap, cannot_train=conflicts[node_id]) if node_id in conflicts else cap
        for node_id, cap in by_id.items()
    }


def next_weights_generation(plan: RolePlan, previous: RolePlan | None) -> int:
    """The previous plan's weights generation while its weights group (members and master
    address) is the same as `plan`'s, else one above it."""
    return _weights_generation(plan.weights_members(), plan.group.master_addr, previous)


def _weights_generation(
    receivers: tuple[str, ...], master_addr: str, previous: RolePlan | None
) -> int:
    if previous is None:
        return 1 if receivers else 0
    same = previous.weights_members() == receivers and previous.group.master_addr == master_addr
    return previous.weights_generation if same else previous.weights_generation + 1


def next_generation(
    ranks: tuple[str, ...],
    group: GroupSpec,
    previous: RolePlan | None,
    highest_generation: int,
    local_world_sizes: tuple[int, ...] | None = None,
) -> int:
    """The generation of a plan with `ranks`, `local_world_sizes` (None: one process per node)
    and `group`: the previous plan's while the group is the same and no newer generation was
    seen, else one above every generation seen (`highest_generation` and the previous plan's),
    so a generation never repeats."""
    seen = max(highest_generation, previous.generation if previous is not None else 0)
    sizes = (1,) * len(ranks) if local_world_sizes is None else tuple(local_world_sizes)
    if (
        previous is not None
        and previous.generation == seen
        and previous.training_ranks == ranks
        and previous.local_world_sizes == sizes
        and previous.group == group
    ):
        return seen
    return seen + 1


def trainer_order_key(cap: NodeCapabilities, prefer_vram: bool) -> tuple[float, float, str]:
    """Sort key among candidates of one preference: more VRAM and GPUs first, then node id."""
    if prefer_vram:
        return (-cap.gpu_vram_gb, -cap.gpu_count, cap.node_id)
    return (-cap.gpu_count, -cap.gpu_vram_gb, cap.node_id)


def can_train(cap: NodeCapabilities, backend: BackendChoice) -> bool:
    """Whether `cap` may take a training rank under `backend`."""
    if cap.cannot_train:
        return False
    if cap.preference is Role.TRAINING:
        return cap.gpu_count > 0 or backend != "nccl"
    if cap.preference is Role.AUTO:
        return cap.gpu_count > 0 or backend == "gloo"
    return False


def capabilities_from_meta(
    node_id: str,
    address: str,
    meta: Mapping[str, object],
    host: HostEntry | None = None,
) -> NodeCapabilities:
    """Capabilities from a member's gossiped meta (`role`, `gpu_count`, `gpu_vram_gb`, `gpu`,
    `cannot_train`, `gpu_uuids`, `training_nproc`), falling back to its inventory entry, then
    to a GPU-less `auto` node running one training process."""
    return NodeCapabilities(
        node_id=node_id,
        address=address,
        gpu_count=_meta_int(meta.get("gpu_count"), host.gpu_count if host else 0),
        gpu_type=_meta_str(meta.get("gpu"), host.gpu if host else None),
        gpu_vram_gb=_meta_float(meta.get("gpu_vram_gb"), host.gpu_vram_gb if host else 0.0),
        preference=_meta_role(meta.get("role"), host.role if host else Role.AUTO),
        cannot_train=_meta_str(meta.get(CANNOT_TRAIN_META), None),
        gpu_uuids=gpu_uuids_from_meta(meta),
        nproc=max(1, _meta_int(meta.get(NPROC_META), 1)),
    )


def _by_id(members: Sequence[NodeCapabilities]) -> dict[str, NodeCapabilities]:
    by_id: dict[str, NodeCapabilities] = {}
    for cap in sorted(members, key=lambda cap: cap.node_id):
        if cap.node_id in by_id:
            raise PlanError(f"member {cap.node_id!r} is listed twice")
        by_id[cap.node_id] = cap
    return by_id


def _choose_trainers(members: Iterable[NodeCapabilities], policy: RolePolicy) -> list[str]:
    candidates = [cap for cap in members if can_train(cap, policy.backend)]
    preferring = [cap for cap in candidates if cap.preference is Role.TRAINING]
    auto = [cap for cap in candidates if cap.preference is Role.AUTO]
    ordered = sorted(preferring, key=lambda cap: trainer_order_key(cap, policy.prefer_vram))
    ordered += sorted(auto, key=lambda cap: trainer_order_key(cap, policy.prefer_vram))
    return [cap.node_id for cap in ordered[: policy.max_training]]


def _stable_ranks(chosen: list[str], previous: RolePlan | None) -> list[str]:
    if previous is None:
        return list(chosen)
    picked = set(chosen)
    survivors = [node for node in previous.training_ranks if node in picked]
    kept = set(survivors)
    return survivors + [node for node in chosen if node not in kept]


def _non_training_role(cap: NodeCapabilities) -> Role:
    if cap.preference in (Role.INFERENCE, Role.SELFPLAY):
        return cap.preference
    return AUTO_FALLBACK_ROLE


def _resolve_backend(choice: BackendChoice, trainers: Sequence[NodeCapabilities]) -> Backend:
    if choice == "nccl":
        return "nccl"
    if choice == "gloo":
        return "gloo"
    if trainers and all(cap.gpu_count > 0 for cap in trainers):
        return "nccl"
    return "gloo"


def _note(
    eligible: int, training: int, by_id: Mapping[str, NodeCapabilities], policy: RolePolicy
) -> str:
    members = len(by_id)
    if training == 0 and eligible < policy.min_training:
        gpuless_auto = policy.backend == "auto" and any(
            cap.gpu_count == 0 and cap.preference is Role.AUTO and not cap.cannot_train
            for cap in by_id.values()
        )
        hint = (
            "; a GPU-less node trains only with role training or backend gloo"
            if gpuless_auto
            else ""
        )
        return (
            f"nobody trains: {eligible} of {members} members can train, "
            f"min_training is {policy.min_training}{hint}"
        )
    return (
        f"{training} of {members} members train "
        f"(min {policy.min_training}, max {policy.max_training})"
    )


def _meta_int(value: object, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _meta_float(value: object, default: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return default


def _meta_str(value: object, default: str | None) -> str | None:
    return value if isinstance(value, str) and value else default


def _meta_role(value: object, default: Role) -> Role:
    if isinstance(value, str):
        try:
            return Role(value)
        except ValueError:
            return default
    return default


@dataclass(frozen=True, slots=True)
class PlanDebouncer:
    """When to recompute the plan after membership changes: `quiet_s` after the last change,
    but no later than `max_wait_s` after the first, so a burst of joins and deaths makes one plan.

    Pure state: each method returns a new debouncer.
    """

    quiet_s: float = 0.5
    max_wait_s: float = 2.0
    first_change_at: float | None = None
    last_change_at: float | None = None

    def __post_init__(self) -> None:
        if self.quiet_s < 0 or self.max_wait_s < self.quiet_s:
            raise PlanError("debounce needs 0 <= quiet_s <= max_wait_s")

    @property
    def pending(self) -> bool:
        return self.first_change_at is not None

    def changed(self, now: float) -> PlanDebouncer:
        """Record a change at `now`."""
        first = now if self.first_change_at is None else self.first_change_at
        return replace(self, first_change_at=first, last_change_at=now)

    def due_at(self) -> float | None:
        """When the pending changes should produce a plan; None when nothing is pending."""
        if self.first_change_at is None or self.last_change_at is None:
            return None
        return min(self.last_change_at + self.quiet_s, self.first_change_at + self.max_wait_s)

    def is_due(self, now: float) -> bool:
        due = self.due_at()
        return due is not None and now >= due

    def cleared(self) -> PlanDebouncer:
        """Nothing pending (after the plan was computed, or when this node stopped leading)."""
        return replace(self, first_change_at=None, last_change_at=None)
