"""The state of one node's election: its config, the durable record a restart keeps, and the
queries on it (lease, vote denial, next wake-up). Transitions live in `node.election.core`.
"""

from __future__ import annotations

import enum
import logging
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from config import Timeouts
from node.errors import ElectionError
from node.plan import PlanFence, RolePlan

log = logging.getLogger("node.election.elector")  # log_event speaks for the elector


class ElectionRole(enum.StrEnum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    COORDINATOR = "coordinator"


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """One node's view of the election: its id, the fixed voters, and the timing.

    `pulls_plans`: this node fetches a plan a heartbeat announces from the members it names
    (its acknowledgements say so); a member still behind `plan_pull_grace_s` after a plan was
    published gets it whole from the coordinator (node.election.spread).

    `max_observer_heartbeats`: the most non-voters one observer round heartbeats. Past it the
    rounds take turns (node id order, each round going on after the last), so the coordinator's
    heartbeat work stays bounded however many members there are, and the voters' heartbeats,
    which hold the lease, never queue behind thousands of others (docs/scale.md); each observer
    then hears the coordinator once per turn of the rotation.

    A coordinator's lease counts `lease_s * (1 - clock_drift)` from the send time of the round a
    majority acknowledged; voters deny votes for `lease_s` from receiving it, so the two
    windows cannot overlap while clock rates differ by less than `clock_drift`.
    """

    node_id: str
    voters: tuple[str, ...]
    heartbeat_interval_s: float = 0.15
    lease_s: float = 0.75
    election_min_s: float = 0.75
    election_max_s: float = 1.25
    observer_interval_s: float = 0.6
    clock_drift: float = 0.01
    plan_pull_grace_s: float = 3.0
    pulls_plans: bool = False
    max_observer_heartbeats: int = 1500

    def __post_init__(self) -> None:
        if not self.voters or len(set(self.voters)) != len(self.voters):
            raise ElectionError(f"voters {self.voters!r} must be a non-empty set of node ids")
        if not 0 < self.heartbeat_interval_s < self.lease_s:
            raise ElectionError("heartbeat_interval_s must be positive and below lease_s")
        if not 0 < self.election_min_s <= self.election_max_s:
            raise ElectionError("election timeouts need 0 < election_min_s <= election_max_s")
        if not 0 <= self.clock_drift < 0.5 or self.observer_interval_s <= 0:
            raise ElectionError("clock_drift must be in [0, 0.5), observer_interval_s positive")
        if self.plan_pull_grace_s <= 0:
            raise ElectionError("plan_pull_grace_s must be positive")
        if self.max_observer_heartbeats < 1:
            raise ElectionError("max_observer_heartbeats must be at least 1")

    @classmethod
    def from_timeouts(
        cls, node_id: str, voters: Iterable[str], timeouts: Timeouts, **overrides: float
    ) -> ElectionConfig:
        """The config of `node_id` with the timing of the timeout table."""
        return cls(
            node_id=node_id,
            voters=tuple(voters),
            heartbeat_interval_s=overrides.get(
                "heartbeat_interval_s", timeouts.heartbeat_interval_s
            ),
            lease_s=overrides.get("lease_s", timeouts.lease_s),
            election_min_s=overrides.get("election_min_s", timeouts.election_min_s),
            election_max_s=overrides.get("election_max_s", timeouts.election_max_s),
            observer_interval_s=overrides.get(
                "observer_interval_s", 4 * timeouts.heartbeat_interval_s
            ),
            clock_drift=overrides.get("clock_drift", 0.01),
        )

    @property
    def quorum(self) -> int:
        """A strict majority of the whole voter set."""
        return len(self.voters) // 2 + 1

    @property
    def is_voter(self) -> bool:
        return self.node_id in self.voters

    @property
    def coordinator_lease_s(self) -> float:
        return self.lease_s * (1.0 - self.clock_drift)

    def observer_rotation_s(self, observers: int) -> float:
        """How much longer than one observer round it takes to heartbeat `observers` once: 0
        while they fit in one round (`max_observer_heartbeats`)."""
        rounds = math.ceil(observers / self.max_observer_heartbeats)
        return max(0, rounds - 1) * self.observer_interval_s


class PeerFences(Mapping[str, "PlanFence | None"]):
    """The plan fence each follower reported, immutable. `with_fence` returns a table that
    shares all but one of its SHARDS dicts with this one: a coordinator of N followers records
    an acknowledgement in O(N / SHARDS) instead of copying all N."""

    SHARDS = 64
    __slots__ = ("_count", "_shards")

    def __init__(self, fences: Mapping[str, PlanFence | None] | None = None) -> None:
        shards: list[dict[str, PlanFence | None]] = [{} for _ in range(self.SHARDS)]
        for node, fence in (fences or {}).items():
            shards[hash(node) % self.SHARDS][node] = fence
        self._shards = tuple(shards)
        self._count = sum(len(shard) for shard in shards)

    def __getitem__(self, node: str) -> PlanFence | None:
        return self._shards[hash(node) % self.SHARDS][node]

    def __iter__(self) -> Iterator[str]:
        return (node for shard in self._shards for node in shard)

    def __len__(self) -> int:
        return self._count

    def with_fence(self, node: str, fence: PlanFence | None) -> PeerFences:
        index = hash(node) % self.SHARDS
        shard = {**self._shards[index], node: fence}
        table = PeerFences.__new__(PeerFences)
        table._shards = (*self._shards[:index], shard, *self._shards[index + 1 :])
        table._count = self._count + len(shard) - len(self._shards[index])
        return table


@dataclass(frozen=True, slots=True)
class DurableRecord:
    """What a restart must remember: the highest term seen, the vote given in it, and the
    highest training generation seen (so a coordinator after a restart never repeats one)."""

    term: int = 0
    voted_for: str | None = None
    generation: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"term": self.term, "voted_for": self.voted_for, "generation": self.generation}

    @classmethod
    def from_value(cls, value: object) -> DurableRecord:
        """The record stored as JSON; a fresh record for None. ElectionError if corrupt."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise ElectionError(f"stored election state {value!r} is not an object")
        term, voted_for = value.get("term"), value.get("voted_for")
        generation = value.get("generation", 0)
        if voted_for is not None and not isinstance(voted_for, str):
            raise ElectionError(f"stored vote {voted_for!r} is not a node id")
        return cls(_count(term, "term"), voted_for, _count(generation, "generation"))


def _count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ElectionError(f"stored election {name} {value!r} is not an integer >= 0")
    return value


@dataclass(frozen=True, slots=True)
class ElectionState:
    """Everything one node knows about the election. Times are this node's monotonic clock.

    `votes`: who granted the current candidacy (pre-votes while `pre_vote`). Coordinator only:
    `rounds` (seq, sent time) of recent heartbeat rounds, `acked` voter -> send time of the
    newest round it acknowledged, `peer_fences` the plan fence each follower reported.
    `generation` is the highest training generation seen: in any plan applied, or reported in
    a follower's acknowledgement. Coordinator only: `whole_plans` are the followers whose
    acknowledgements do not say `pulls_plans` (a new plan goes to them whole),
    `plan_published_at` when it published its current plan, `observer_cursor` the last observer
    heartbeated while they take turns (None: the next observer round starts from the first), and
    `plan_tree_start` the cursor when the current plan was published: its pull tree lists the
    pullers in the order the rotation reaches them from there, so parents hear before children.
    """

    config: ElectionConfig
    role: ElectionRole
    term: int
    voted_for: str | None
    coordinator: str | None
    plan: RolePlan | None
    election_deadline: float
    leader_seen_at: float | None
    votes: frozenset[str] = frozenset()
    pre_vote: bool = False
    won_at: float = 0.0
    seq: int = 0
    rounds: tuple[tuple[int, float], ...] = ()
    acked: Mapping[str, float] = field(default_factory=dict)
    peer_fences: Mapping[str, PlanFence | None] = field(default_factory=dict)
    next_heartbeat_at: float = 0.0
    next_observer_heartbeat_at: float = 0.0
    observers: frozenset[str] = frozenset()
    generation: int = 0
    whole_plans: frozenset[str] = frozenset()
    plan_published_at: float = -math.inf
    observer_cursor: str | None = None
    plan_tree_start: str | None = None

    @property
    def durable(self) -> DurableRecord:
        return DurableRecord(self.term, self.voted_for, self.generation)

    @property
    def plan_fence(self) -> PlanFence | None:
        return None if self.plan is None else self.plan.fence


def initial_state(
    config: ElectionConfig,
    durable: DurableRecord,
    plan: RolePlan | None,
    now: float,
    rng: random.Random,
) -> ElectionState:
    """The state after a (re)start. The node denies votes for one lease after booting, since
    it may have acknowledged a coordinator it no longer remembers."""
    return ElectionState(
        config=config,
        role=ElectionRole.FOLLOWER,
        term=durable.term,
        voted_for=durable.voted_for,
        coordinator=None,
        plan=plan,
        election_deadline=now + election_timeout(config, rng),
        leader_seen_at=now,
        generation=max(durable.generation, plan.generation if plan is not None else 0),
    )


def election_timeout(config: ElectionConfig, rng: random.Random) -> float:
    return rng.uniform(config.election_min_s, config.election_max_s)


def with_observers(state: ElectionState, observers: Iterable[str]) -> ElectionState:
    """Set the non-voters the coordinator heartbeats (they follow; they never vote)."""
    others = frozenset(observers) - set(state.config.voters) - {state.config.node_id}
    return replace(state, observers=others)


def lease_until(state: ElectionState) -> float | None:
    """Until when the coordinator's lease holds (inf for a one-voter cluster), or None."""
    if state.role is not ElectionRole.COORDINATOR:
        return None
    need = state.config.quorum - 1
    if need == 0:
        return math.inf
    acked = sorted(state.acked.values(), reverse=True)
    if len(acked) < need:
        return None
    return acked[need - 1] + state.config.coordinator_lease_s


def lease_valid(state: ElectionState, now: float) -> bool:
    """True while this node is coordinator and a majority acknowledged within the lease."""
    until = lease_until(state)
    return until is not None and now < until


def lease_backers(state: ElectionState, now: float) -> frozenset[str]:
    """The voters whose acknowledgements hold the lease now (the coordinator included)."""
    if state.role is not ElectionRole.COORDINATOR:
        return frozenset()
    lease = state.config.coordinator_lease_s
    fresh = {voter for voter, sent in state.acked.items() if now < sent + lease}
    return frozenset(fresh | {state.config.node_id})


def follows_live_coordinator(state: ElectionState, now: float) -> bool:
    """True while this node must deny votes: it leads, or heard a coordinator within the lease."""
    if state.role is ElectionRole.COORDINATOR:
        return True
    seen = state.leader_seen_at
    return seen is not None and now - seen < state.config.lease_s


def next_wakeup(state: ElectionState) -> float:
    """The next time `on_tick` has something to do."""
    if state.role is ElectionRole.COORDINATOR:
        return min(state.next_heartbeat_at, stepdown_at(state))
    return state.election_deadline if state.config.is_voter else math.inf


def next_plan_version(state: ElectionState) -> int:
    """The version the coordinator's next plan carries: one past the newest it applied."""
    return 1 if state.plan is None else state.plan.version + 1


def stepdown_at(state: ElectionState) -> float:
    """When a coordinator without a renewed lease steps down."""
    until = lease_until(state)
    return state.won_at + state.config.lease_s if until is None else until


@dataclass(frozen=True, slots=True)
class ElectionStatus:
    """What a node shows of its election: `lease_valid` is the coordinator's lease, or for a
    follower whether it heard its coordinator within the lease."""

    node_id: str
    role: ElectionRole
    term: int
    coordinator: str | None
    lease_valid: bool
    is_voter: bool
    plan_fence: PlanFence | None

    @property
    def plan_version(self) -> int | None:
        return None if self.plan_fence is None else self.plan_fence.version

    def to_dict(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "role": self.role.value,
            "term": self.term,
            "coordinator": self.coordinator,
            "lease_valid": self.lease_valid,
            "is_voter": self.is_voter,
            "plan_fence": None if self.plan_fence is None else self.plan_fence.to_list(),
        }


def status_of(state: ElectionState, now: float) -> ElectionStatus:
    if state.role is ElectionRole.COORDINATOR:
        live = lease_valid(state, now)
    else:
        seen = state.leader_seen_at
        heard = seen is not None and now - seen < state.config.lease_s
        live = state.coordinator is not None and heard
    return ElectionStatus(
        node_id=state.config.node_id,
        role=state.role,
        term=state.term,
        coordinator=state.coordinator,
        lease_valid=live,
        is_voter=state.config.is_voter,
        plan_fence=state.plan_fence,
    )


class ElectionEventKind(enum.StrEnum):
    """What changed, as listeners are told."""

    ELECTED = "elected"
    STEPPED_DOWN = "stepped_down"
    COORDINATOR_CHANGED = "coordinator_changed"
    PLAN_ADOPTED = "plan_adopted"


@dataclass(frozen=True, slots=True)
class ElectionEvent:
    """One change of a node's election state; `status` is the state after it."""

    kind: ElectionEventKind
    status: ElectionStatus
    plan: RolePlan | None = None


def events_between(old: ElectionState, new: ElectionState, now: float) -> list[ElectionEvent]:
    """The events that lead from `old` to `new`, in the order listeners hear them."""
    status = status_of(new, now)
    events: list[ElectionEvent] = []
    if old.role is ElectionRole.COORDINATOR and (
        new.role is not ElectionRole.COORDINATOR or new.term != old.term
    ):
        events.append(ElectionEvent(ElectionEventKind.STEPPED_DOWN, status))
    if new.role is ElectionRole.COORDINATOR and (
        old.role is not ElectionRole.COORDINATOR or new.term != old.term
    ):
        events.append(ElectionEvent(ElectionEventKind.ELECTED, status))
    if new.coordinator is not None and (new.term, new.coordinator) != (old.term, old.coordinator):
        events.append(ElectionEvent(ElectionEventKind.COORDINATOR_CHANGED, status))
    if new.plan is not None and new.plan_fence != old.plan_fence:
        events.append(ElectionEvent(ElectionEventKind.PLAN_ADOPTED, status, new.plan))
    return events


def log_event(event: ElectionEvent) -> None:
    """Log an election event: a step down at WARNING, the others at INFO."""
    status, plan = event.status, event.plan
    what = {
        ElectionEventKind.ELECTED: "elected coordinator",
        ElectionEventKind.STEPPED_DOWN: "stepped down as coordinator",
        ElectionEventKind.COORDINATOR_CHANGED: f"coordinator is {status.coordinator}",
        ElectionEventKind.PLAN_ADOPTED: "adopted plan "
        + ("-" if plan is None else f"{plan.fence.to_header()} ({plan.note})"),
    }[event.kind]
    level = logging.WARNING if event.kind is ElectionEventKind.STEPPED_DOWN else logging.INFO
    log.log(level, "node %s term %s: %s", status.node_id, status.term, what)
