"""Randomized schedules of the pure election core under a discrete-event simulator: delays,
drops, one-way cuts, partitions, crashes (memory and unwritten state lost) and restarts.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

import pytest

from config import Role
from node.election import core
from node.election.adoption import AdoptionRecord, adoption_record, check_adoption_logs
from node.election.messages import Heartbeat, HeartbeatAck, Outbound, VoteReply, VoteRequest
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.election.state import (
    DurableRecord,
    ElectionConfig,
    ElectionRole,
    ElectionState,
    events_between,
    initial_state,
    lease_backers,
    lease_until,
    lease_valid,
    next_plan_version,
    next_wakeup,
    with_observers,
)
from node.plan import GroupSpec, RolePlan

VOTERS = ("a", "b", "c", "d", "e")
NODES = (*VOTERS, "x")
POLICY = RolePolicy(min_training=1, max_training=3)
CAPS = {
    n: NodeCapabilities(n, f"10.0.0.{i + 1}", 1, "H100", 24 + i, Role.AUTO)
    for i, n in enumerate(NODES)
}


@dataclass
class SimNode:
    node_id: str
    state: ElectionState | None = None
    incarnation: int = 0
    offset: float = 0.0
    rate: float = 1.0
    stored: DurableRecord = field(default_factory=DurableRecord)
    stored_plan: RolePlan | None = None
    timer: int = 0

    def local(self, now: float) -> float:
        return self.offset + self.rate * now

    def to_global(self, local: float) -> float:
        return (local - self.offset) / self.rate


class Violation(AssertionError):
    pass


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.queue: list[tuple[float, int, str, tuple[object, ...]]] = []
        self.counter = itertools.count()
        self.nodes = {n: SimNode(n) for n in NODES}
        self.blocked: set[tuple[str, str]] = set()
        self.drop_rate = 0.0
        self.delay = (0.001, 0.03)
        self.leaders: dict[int, str] = {}
        self.votes: dict[tuple[str, int], str] = {}
        self.logs: dict[str, list[AdoptionRecord]] = {n: [] for n in NODES}
        self.elections = 0
        self.groups: dict[int, tuple[tuple[str, ...], GroupSpec]] = {}
        self.calmed = False
        for node in self.nodes.values():
            self.boot(node)

    # -- plumbing ---------------------------------------------------------------------------

    def push(self, at: float, kind: str, *payload: object) -> None:
        heapq.heappush(self.queue, (at, next(self.counter), kind, payload))

    def config(self, node_id: str) -> ElectionConfig:
        return ElectionConfig(node_id, VOTERS)

    def boot(self, node: SimNode) -> None:
        node.incarnation += 1
        node.offset = self.rng.uniform(0, 1000)
        node.rate = 1.0 + self.rng.uniform(-0.004, 0.004)
        state = initial_state(
            self.config(node.node_id), node.stored, node.stored_plan, node.local(self.now), self.rng
        )
        node.state = with_observers(state, ["x"]) if node.node_id in VOTERS else state
        self.schedule_timer(node)

    def crash(self, node: SimNode) -> None:
        node.state = None
        node.incarnation += 1

    def schedule_timer(self, node: SimNode) -> None:
        assert node.state is not None
        node.timer += 1
        wake = next_wakeup(node.state)
        if wake != float("inf"):
            # a hair late, so the node's own clock has surely reached `wake` when it fires
            at = max(self.now, node.to_global(wake)) + 1e-7
            self.push(at, "timer", node.node_id, node.timer)

    def apply(self, node: SimNode, new: ElectionState, out: list[Outbound]) -> None:
        """Adopt a step's result: check invariants, persist, then release its messages."""
        old = node.state
        assert old is not None
        local = node.local(self.now)
        node.state = new
        for event in events_between(old, new, local):
            backers = None
            if event.plan is not None and new.role is ElectionRole.COORDINATOR:
                backers = tuple(sorted(lease_backers(new, local)))
            record = adoption_record(event, self.now, backers)
            if record is not None:
                self.logs[node.node_id].append(record)
        if new.role is ElectionRole.COORDINATOR and old.role is not ElectionRole.COORDINATOR:
            self.elections += 1
            holder = self.leaders.setdefault(new.term, node.node_id)
            if holder != node.node_id:
                raise Violation(f"term {new.term}: {holder} and {node.node_id} both lead")
        before, after = old.plan, new.plan
        if before is not None and after is not None and after.generation < before.generation:
            raise Violation(f"{node.node_id}: generation went back to {after.generation}")
        self.check_leases(node)
        self.check_denials_cover_leases()
        durable_changed = new.durable != node.stored or (
            new.plan is not None and new.plan != node.stored_plan
        )
        if durable_changed:
            delay = 0.002
            self.push(
                self.now + delay,
                "persisted",
                node.node_id,
                node.incarnation,
                new.durable,
                new.plan,
                out,
            )
        else:
            self.release(node, out)
        self.schedule_timer(node)

    def release(self, node: SimNode, out: list[Outbound]) -> None:
        for item in out:
            message = item.message
            if isinstance(message, VoteReply) and message.granted and not message.pre_vote:
                key = (node.node_id, message.term)
                previous = self.votes.setdefault(key, item.to)
                if previous != item.to:
                    raise Violation(
                        f"{node.node_id} voted {previous} and {item.to} in {message.term}"
                    )
            if isinstance(message, VoteReply) and message.granted:
                self.check_no_deserted_lease(node.node_id, item.to, message.pre_vote)
            if (node.node_id, item.to) in self.blocked or self.rng.random() < self.drop_rate:
                continue
            self.push(self.now + self.rng.uniform(*self.delay), "deliver", item.to, message)

    def check_no_deserted_lease(self, voter: str, candidate: str, pre_vote: bool) -> None:
        """A voter whose acknowledgement holds a live coordinator's lease grants no (pre-)vote
        to anyone else: the lease and the denial window must cover each other. This catches a
        broken denial at the grant, whether or not the candidate goes on to win."""
        for other in self.nodes.values():
            state = other.state
            if state is None or other.node_id in (voter, candidate):
                continue
            local = other.local(self.now)
            if lease_valid(state, local) and voter in lease_backers(state, local):
                kind = "pre-vote" if pre_vote else "vote"
                raise Violation(
                    f"{voter} granted {candidate} a {kind} at {self.now:.3f} while backing "
                    f"{other.node_id}'s live lease (term {state.term})"
                )

    def check_denials_cover_leases(self) -> None:
        """No voter's vote denial (lease_s after it last heard its coordinator, by its clock)
        lapses while a live lease still counts its acknowledgement: at that moment it could
        vote for someone else, whether or not anyone asks."""
        for leader in self.nodes.values():
            state = leader.state
            if state is None or not lease_valid(state, leader.local(self.now)):
                continue
            for voter in lease_backers(state, leader.local(self.now)) - {leader.node_id}:
                follower = self.nodes[voter].state
                if follower is None:
                    continue
                local = self.nodes[voter].local(self.now)
                seen = follower.leader_seen_at
                denies = follower.role is ElectionRole.COORDINATOR or (
                    seen is not None and local - seen < follower.config.lease_s
                )
                if not denies:
                    raise Violation(
                        f"{voter}'s vote denial lapsed at {self.now:.3f} while it backs "
                        f"{leader.node_id}'s live lease (term {state.term})"
                    )

    def check_leases(self, node: SimNode) -> None:
        holders = []
        for other in self.nodes.values():
            state = other.state
            if state is None or not lease_valid(state, other.local(self.now)):
                continue
            until = lease_until(state)
            assert until is not None
            holders.append((other.node_id, state.term, other.to_global(until)))
        if len(holders) > 1:
            raise Violation(f"two leases at {self.now:.3f}: {holders}")

    # -- events -----------------------------------------------------------------------------

    def step(self) -> None:
        at, _, kind, payload = heapq.heappop(self.queue)
        self.now = at
        if kind == "timer":
            node_id, timer = payload
            node = self.nodes[str(node_id)]
            if node.state is None or timer != node.timer:
                return
            local = node.local(self.now)
            new, out = core.on_tick(node.state, local, self.rng)
            self.apply(node, new, out)
            self.maybe_publish(node, local)
        elif kind == "deliver":
            target, message = payload
            node = self.nodes[str(target)]
            if node.state is None:
                return
            assert isinstance(message, VoteRequest | VoteReply | Heartbeat | HeartbeatAck)
            local = node.local(self.now)
            new, out = core.on_message(node.state, message, local, self.rng)
            self.apply(node, new, out)
            self.maybe_publish(node, local)
        elif kind == "persisted":
            node_id, incarnation, durable, plan, released = payload
            node = self.nodes[str(node_id)]
            if node.state is None or incarnation != node.incarnation:
                return  # crashed before the write finished: nothing stored, nothing sent
            assert isinstance(durable, DurableRecord)
            assert isinstance(released, list)
            node.stored = durable
            if isinstance(plan, RolePlan):
                node.stored_plan = plan
            self.release(node, released)
        elif kind == "fault":
            self.fault()
        elif kind == "boot":
            node = self.nodes[str(payload[0])]
            if node.state is None:
                self.boot(node)

    def maybe_publish(self, node: SimNode, local: float) -> None:
        """Publish a plan as a coordinator would: on a new term, and now and then anew."""
        state = node.state
        assert state is not None
        if not lease_valid(state, local):
            return
        fresh_term = state.plan is None or state.plan.term != state.term
        if not fresh_term and (self.calmed or self.rng.random() > 0.02):
            return
        alive = [CAPS[n] for n, other in self.nodes.items() if other.state is not None]
        plan = compute_plan(
            state.term,
            next_plan_version(state),
            alive,
            POLICY,
            previous=state.plan,
            highest_generation=state.generation,
        )
        group = (plan.training_ranks, plan.group)
        if self.groups.setdefault(plan.generation, group) != group:
            raise Violation(f"generation {plan.generation} names two groups")
        new, out = core.publish_plan(state, plan, local)
        self.apply(node, new, out)

    def fault(self) -> None:
        choice = self.rng.random()
        names = list(NODES)
        leaders = [n for n in names if self.leads(n)]
        if choice < 0.2:
            self.rng.shuffle(names)
            cut = self.rng.randint(1, len(names) - 1)
            groups = (set(names[:cut]), set(names[cut:]))
            if leaders and self.rng.random() < 0.5:  # the coordinator alone: the rest elects
                groups = ({leaders[0]}, set(names) - {leaders[0]})
            self.blocked = {
                (a, b) for a in NODES for b in NODES if (a in groups[0]) != (b in groups[0])
            }
        elif choice < 0.3:
            if leaders and self.rng.random() < 0.5:  # one voter stops hearing the coordinator
                deaf = self.rng.choice([v for v in VOTERS if v != leaders[0]])
                self.blocked.add((leaders[0], deaf))
            else:
                self.blocked.add((self.rng.choice(names), self.rng.choice(names)))
        elif choice < 0.45:
            self.blocked.clear()
        elif choice < 0.6:
            victim = self.nodes[self.rng.choice(leaders or names)]
            if victim.state is not None:
                self.crash(victim)
                if self.rng.random() < 0.5:  # systemd restarts it at once
                    self.push(self.now + self.rng.uniform(0.001, 0.05), "boot", victim.node_id)
        elif choice < 0.75:
            for node in self.nodes.values():
                if node.state is None and self.rng.random() < 0.6:
                    self.boot(node)
        elif choice < 0.9:
            self.drop_rate = self.rng.choice([0.0, 0.0, 0.05, 0.2, 0.5])
        else:
            high = self.rng.choice([0.03, 0.2, 0.8])
            self.delay = (0.001, high)

    def leads(self, node_id: str) -> bool:
        state = self.nodes[node_id].state
        return state is not None and state.role is ElectionRole.COORDINATOR

    def calm(self) -> None:
        self.calmed = True
        self.blocked.clear()
        self.drop_rate = 0.0
        self.delay = (0.001, 0.03)
        for node in self.nodes.values():
            if node.state is None:
                self.boot(node)

    def run_until(self, end: float) -> None:
        while self.queue and self.queue[0][0] <= end:
            self.step()
        self.now = end


ACT_S = 3.5
"""How long each opening act holds its cut: longer than election_max_s, so someone stands."""


def opening_acts(sim: Sim) -> None:
    """Every schedule opens with the two faults that test the lease against the vote denial:
    one follower stops hearing the coordinator (it stands while the lease is live: the others
    must deny), then the coordinator is cut off (the rest elect once the denial window ends,
    which must not be before its lease does)."""
    for act in ("deafen", "isolate"):
        deadline = sim.now + 10.0
        while not any(sim.leads(n) for n in NODES) and sim.now < deadline:
            sim.run_until(sim.now + 0.25)
        leaders = [n for n in NODES if sim.leads(n)]
        if not leaders:
            continue
        leader = leaders[0]
        if act == "deafen":
            deaf = sim.rng.choice([v for v in VOTERS if v != leader])
            sim.blocked = {(leader, deaf)}
        else:
            sim.blocked = {(a, b) for a in NODES for b in NODES if (a == leader) != (b == leader)}
        sim.run_until(sim.now + ACT_S)
        sim.blocked = set()
        sim.run_until(sim.now + 1.0)


def run_schedule(seed: int, chaos_s: float = 20.0, calm_s: float = 8.0) -> Sim:
    sim = Sim(seed)
    opening_acts(sim)
    chaos_s += sim.now
    at = sim.now
    while at < chaos_s:
        at += sim.rng.uniform(0.2, 2.5)
        sim.push(at, "fault")
    sim.run_until(chaos_s)
    sim.queue = [event for event in sim.queue if event[2] != "fault"]
    heapq.heapify(sim.queue)
    sim.calm()
    sim.run_until(chaos_s + calm_s)
    return sim


@pytest.mark.parametrize("block", range(4))
def test_randomized_schedules_keep_every_invariant(block: int) -> None:
    """Five voters and one non-voter, each clock with its own offset and a rate within the
    drift bound. Checked throughout: one coordinator per term, no two leases at once, no voter
    votes twice in a term, no vote denial lapses under a live lease, plans only move forward on
    every node, generations never go back on a node and never name two groups. After the faults
    stop, one coordinator leads and every node follows its plan."""
    elections = 0
    for seed in range(block * 50, block * 50 + 50):
        sim = run_schedule(seed)
        elections += sim.elections
        problems = check_adoption_logs(sim.logs, VOTERS)
        assert problems == [], f"seed {seed}: {problems}"
        leaders = [
            n.node_id
            for n in sim.nodes.values()
            if n.state is not None and lease_valid(n.state, n.local(sim.now))
        ]
        assert len(leaders) == 1, f"seed {seed}: after calm, lease holders {leaders}"
        leader = sim.nodes[leaders[0]].state
        assert leader is not None
        for node in sim.nodes.values():
            assert node.state is not None
            assert node.state.term == leader.term, f"seed {seed}: {node.node_id} lags"
            assert node.state.coordinator == leaders[0]
            assert node.state.plan_fence == leader.plan_fence
    assert elections >= 100  # the schedules really do fail over


def _caught(seeds: range) -> int:
    caught = 0
    for seed in seeds:
        try:
            sim = run_schedule(seed, chaos_s=12.0, calm_s=0.0)
        except Violation:
            caught += 1
            continue
        caught += bool(check_adoption_logs(sim.logs, VOTERS))
    return caught


@pytest.mark.parametrize("mutant", ["minority_quorum", "no_lease_denial", "lease_outlives_denial"])
def test_simulator_catches_broken_rules(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness itself: each deliberately broken rule is caught in every schedule (the
    opening acts and the lease/denial checks make each one fail, not just an unlucky seed)."""
    if mutant == "minority_quorum":
        monkeypatch.setattr(ElectionConfig, "quorum", property(lambda self: 2))
    elif mutant == "no_lease_denial":
        monkeypatch.setattr(core, "follows_live_coordinator", lambda state, now: False)
    else:
        monkeypatch.setattr(
            ElectionConfig, "coordinator_lease_s", property(lambda self: self.lease_s * 1.3)
        )
    seeds = range(40)
    assert _caught(seeds) == len(seeds)
