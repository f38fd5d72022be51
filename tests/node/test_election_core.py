"""The election state machine driven by hand: no sockets, no event loop, a fake clock."""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable

import pytest

from config import Role, Timeouts
from node.election import core
from node.election.messages import (
    ElectionError,
    Heartbeat,
    HeartbeatAck,
    Outbound,
    VoteReason,
    VoteReply,
    VoteRequest,
)
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.election.state import (
    DurableRecord,
    ElectionConfig,
    ElectionEventKind,
    ElectionRole,
    ElectionState,
    events_between,
    initial_state,
    lease_backers,
    lease_until,
    lease_valid,
    next_plan_version,
    next_wakeup,
    status_of,
    with_observers,
)
from node.plan import PlanFence, RolePlan

VOTERS = ("a", "b", "c", "d", "e")
TIMEOUTS = Timeouts(heartbeat_interval_s=0.25, lease_s=1.5, election_min_s=1.5, election_max_s=3.0)
"""The timing these pure-function tests are written in (round numbers, not the defaults)."""
LEASE = TIMEOUTS.lease_s
ELECTION_MAX = TIMEOUTS.election_max_s


def config(node_id: str, voters: tuple[str, ...] = VOTERS) -> ElectionConfig:
    return ElectionConfig.from_timeouts(node_id, voters, TIMEOUTS)


class Net:
    """States of several nodes; delivers messages at once unless the link is cut."""

    def __init__(self, nodes: Iterable[str], voters: tuple[str, ...] = VOTERS, now: float = 0.0):
        self.rng = random.Random(1)
        self.now = now
        self.voters = voters
        self.states = {
            n: initial_state(config(n, voters), DurableRecord(), None, now, self.rng) for n in nodes
        }
        self.cut: set[tuple[str, str]] = set()

    def isolate(self, node: str) -> None:
        for other in self.states:
            if other != node:
                self.cut |= {(node, other), (other, node)}

    def run(self, node: str, outbound: list[Outbound]) -> None:
        queue = deque((node, item) for item in outbound)
        while queue:
            source, item = queue.popleft()
            if item.to not in self.states or (source, item.to) in self.cut:
                continue
            state, out = core.on_message(self.states[item.to], item.message, self.now, self.rng)
            self.states[item.to] = state
            queue.extend((item.to, reply) for reply in out)

    def tick(self, node: str) -> None:
        state, out = core.on_tick(self.states[node], self.now, self.rng)
        self.states[node] = state
        self.run(node, out)

    def timeout(self, node: str) -> None:
        state, out = core.on_timeout(self.states[node], self.now, self.rng)
        self.states[node] = state
        self.run(node, out)

    def advance(self, seconds: float, step: float = 0.05) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + step)
            for node in sorted(self.states):
                self.tick(node)

    def coordinators(self) -> list[str]:
        return [n for n, s in self.states.items() if s.role is ElectionRole.COORDINATOR]


def settled_net(nodes: Iterable[str] = VOTERS, voters: tuple[str, ...] = VOTERS) -> Net:
    """A net past the boot denial window with `a` elected."""
    net = Net(nodes, voters)
    net.now = LEASE + 0.01
    net.timeout("a")
    return net


def test_single_voter_elects_itself() -> None:
    rng = random.Random(0)
    state = initial_state(config("solo", ("solo",)), DurableRecord(), None, 0.0, rng)
    assert next_wakeup(state) >= TIMEOUTS.election_min_s
    state, out = core.on_tick(state, next_wakeup(state), rng)
    assert state.role is ElectionRole.COORDINATOR
    assert state.term == 1
    assert state.voted_for == "solo"
    assert out == []
    assert lease_until(state) == math.inf
    assert lease_valid(state, 1e9)
    state, _ = core.on_tick(state, 1e6, rng)
    assert state.role is ElectionRole.COORDINATOR


def test_three_voters_elect_through_pre_vote_then_vote() -> None:
    net = settled_net(("a", "b", "c"), ("a", "b", "c"))
    assert net.coordinators() == ["a"]
    assert {s.term for s in net.states.values()} == {1}
    assert net.states["b"].coordinator == "a"
    assert net.states["c"].coordinator == "a"
    assert lease_valid(net.states["a"], net.now)
    assert net.states["b"].voted_for == "a"


def test_pre_vote_changes_no_voter_state() -> None:
    rng = random.Random(0)
    voter = initial_state(config("b"), DurableRecord(4, "c"), None, 0.0, rng)
    later = LEASE + 1
    new, reply = core.handle_vote_request(voter, VoteRequest(5, "a", pre_vote=True), later, rng)
    assert reply.granted
    assert reply.term == 5
    assert new is voter
    new, reply = core.handle_vote_request(voter, VoteRequest(4, "a", pre_vote=True), later, rng)
    assert not reply.granted
    assert reply.reason == VoteReason.ALREADY_VOTED
    new, reply = core.handle_vote_request(voter, VoteRequest(3, "a", pre_vote=True), later, rng)
    assert not reply.granted
    assert reply.reason == VoteReason.STALE_TERM
    assert reply.term == 4


def test_grants_one_vote_per_term_even_across_restart() -> None:
    rng = random.Random(0)
    later = LEASE + 1
    voter = initial_state(config("b"), DurableRecord(), None, 0.0, rng)
    voter, reply = core.handle_vote_request(voter, VoteRequest(5, "a"), later, rng)
    assert reply.granted
    assert voter.durable == DurableRecord(5, "a")
    _again, reply = core.handle_vote_request(voter, VoteRequest(5, "a"), later, rng)
    assert reply.granted  # a repeated request from the same candidate is answered the same
    _, reply = core.handle_vote_request(voter, VoteRequest(5, "c"), later, rng)
    assert not reply.granted
    assert reply.reason == VoteReason.ALREADY_VOTED
    restarted = initial_state(config("b"), voter.durable, None, 100.0, rng)
    _, reply = core.handle_vote_request(restarted, VoteRequest(5, "c"), 100.0 + later, rng)
    assert not reply.granted
    assert reply.reason == VoteReason.ALREADY_VOTED
    _, reply = core.handle_vote_request(restarted, VoteRequest(6, "c"), 100.0 + later, rng)
    assert reply.granted


def test_restarted_voter_denies_for_one_lease() -> None:
    rng = random.Random(0)
    voter = initial_state(config("b"), DurableRecord(3, None), None, 50.0, rng)
    _, reply = core.handle_vote_request(voter, VoteRequest(4, "a"), 50.0 + LEASE / 2, rng)
    assert not reply.granted
    assert reply.reason == VoteReason.LEASE
    _, reply = core.handle_vote_request(voter, VoteRequest(4, "a"), 50.0 + LEASE, rng)
    assert reply.granted


def test_voter_within_a_live_lease_denies_and_keeps_its_term() -> None:
    net = settled_net()
    net.now += 0.5
    before = net.states["b"]
    for pre_vote in (True, False):
        state, reply = core.handle_vote_request(
            before, VoteRequest(9, "c", pre_vote=pre_vote), net.now, net.rng
        )
        assert not reply.granted
        assert reply.reason == VoteReason.LEASE
        assert state is before
        assert state.term == 1
    # the coordinator itself denies too
    _, reply = core.handle_vote_request(net.states["a"], VoteRequest(9, "c"), net.now, net.rng)
    assert reply.reason == VoteReason.LEASE


def test_disruptive_returning_node_cannot_unseat_the_coordinator() -> None:
    net = settled_net()
    net.isolate("e")
    for _ in range(5):
        net.advance(ELECTION_MAX)
    assert net.states["e"].term == 1  # pre-votes fail: it never even raises its term
    net.cut.clear()
    net.advance(ELECTION_MAX)
    assert net.coordinators() == ["a"]
    assert net.states["a"].term == 1
    assert net.states["e"].coordinator == "a"


def test_minority_never_elects() -> None:
    net = Net(VOTERS)
    net.cut = {
        (x, y) for x in VOTERS for y in VOTERS if {x, y} & {"a", "b"} and {x, y} - {"a", "b"}
    }
    for _ in range(10):
        net.advance(ELECTION_MAX)
    assert set(net.coordinators()) <= {"c", "d", "e"}
    assert len(net.coordinators()) == 1
    assert all(net.states[n].role is not ElectionRole.COORDINATOR for n in "ab")


def test_coordinator_steps_down_without_a_majority_and_majority_fails_over() -> None:
    net = settled_net()
    net.advance(1.0)
    assert lease_valid(net.states["a"], net.now)
    net.cut = {(x, y) for x in VOTERS for y in VOTERS if (x in "ab") != (y in "ab")}
    net.advance(LEASE + 0.1)
    assert net.states["a"].role is ElectionRole.FOLLOWER
    net.advance(6.0)
    leaders = net.coordinators()
    assert len(leaders) == 1
    assert leaders[0] in "cde"
    assert net.states[leaders[0]].term == 2


def test_lease_counts_from_send_time_of_the_round_a_majority_acked() -> None:
    rng = random.Random(0)
    state = _coordinator("a", term=3, now=10.0)
    assert not lease_valid(state, 10.0)
    seq = state.seq
    state, _ = core.handle_heartbeat_ack(state, HeartbeatAck(3, "b", seq, True), 10.2, rng)
    assert lease_until(state) is None  # a and b are 2 of 5
    state, _ = core.handle_heartbeat_ack(state, HeartbeatAck(3, "c", seq, True), 10.4, rng)
    assert lease_until(state) == pytest.approx(10.0 + LEASE * 0.99)
    assert lease_backers(state, 10.5) == {"a", "b", "c"}
    state, _ = core.handle_heartbeat_ack(state, HeartbeatAck(3, "d", 999, True), 10.4, rng)
    assert "d" not in state.acked  # an ack of a round never sent counts for nothing
    state, out = core.on_tick(state, 11.0, rng)
    assert state.role is ElectionRole.COORDINATOR
    assert len(out) == 4  # a due heartbeat round to b, c, d, e
    stepped, _ = core.on_tick(state, 10.0 + LEASE, rng)
    assert stepped.role is ElectionRole.FOLLOWER
    assert stepped.coordinator is None


def test_new_coordinator_without_acks_steps_down_after_one_lease() -> None:
    rng = random.Random(0)
    state = _coordinator("a", term=2, now=5.0)
    assert next_wakeup(state) == pytest.approx(5.25)
    state, out = core.on_tick(state, 5.25, rng)
    assert len(out) == 4
    assert state.role is ElectionRole.COORDINATOR
    state, _ = core.on_tick(state, 5.0 + LEASE, rng)
    assert state.role is ElectionRole.FOLLOWER


def test_higher_term_in_an_ack_makes_the_coordinator_step_down() -> None:
    rng = random.Random(0)
    state = _coordinator("a", term=2, now=0.0)
    state, _ = core.handle_heartbeat_ack(state, HeartbeatAck(4, "c", 1, False), 0.1, rng)
    assert state.role is ElectionRole.FOLLOWER
    assert state.term == 4
    assert state.voted_for is None


def test_candidate_steps_down_on_a_denial_from_a_higher_term() -> None:
    net = Net(("a", "b", "c"), ("a", "b", "c"), now=LEASE + 0.1)
    net.states["c"] = initial_state(
        config("c", ("a", "b", "c")), DurableRecord(7), None, 0, net.rng
    )
    net.cut = {("a", "b"), ("b", "a")}
    net.timeout("a")
    assert net.states["a"].term == 7
    assert net.states["a"].role is ElectionRole.FOLLOWER


def test_non_voter_never_stands_never_votes_but_follows() -> None:
    net = settled_net(("a", "b", "c", "x"), ("a", "b", "c"))
    observer = net.states["x"]
    assert next_wakeup(observer) == math.inf
    same, out = core.on_timeout(observer, 100.0, net.rng)
    assert same is observer
    assert out == []
    _, reply = core.handle_vote_request(observer, VoteRequest(9, "b"), 100.0, net.rng)
    assert not reply.granted
    assert reply.reason == VoteReason.NOT_VOTER
    net.states["a"] = with_observers(net.states["a"], ["x", "b"])
    assert net.states["a"].observers == {"x"}
    net.advance(LEASE)
    assert net.states["x"].coordinator == "a"
    assert net.states["x"].term == 1
    # acks of a non-voter never count toward the lease
    assert "x" not in net.states["a"].acked


def test_heartbeats_carry_the_plan_until_acknowledged() -> None:
    net = settled_net(("a", "b", "c"), ("a", "b", "c"))
    net.advance(0.3)
    leader = net.states["a"]
    plan = _plan(leader.term, next_plan_version(leader), ["a", "b", "c"])
    state, out = core.publish_plan(leader, plan, net.now)
    assert {item.to for item in out} == {"b", "c"}
    assert all(isinstance(i.message, Heartbeat) and i.message.plan == plan for i in out)
    net.states["a"] = state
    net.run("a", out)
    assert net.states["b"].plan == plan
    assert net.states["c"].plan_fence == PlanFence(1, 1)
    state, out = core.on_tick(net.states["a"], net.now + 0.25, net.rng)
    assert all(isinstance(i.message, Heartbeat) and i.message.plan is None for i in out)
    assert all(isinstance(i.message, Heartbeat) and i.message.plan_fence == plan.fence for i in out)


def test_publish_needs_the_lease_and_a_newer_fence() -> None:
    state = _coordinator("a", term=2, now=0.0)
    with pytest.raises(ElectionError, match="no coordinator lease"):
        core.publish_plan(state, _plan(2, 1, ["a"]), 0.1)
    follower = settled_net().states["b"]
    with pytest.raises(ElectionError, match="no coordinator lease"):
        core.publish_plan(follower, _plan(1, 1, ["a"]), 2.0)
    net = settled_net()
    leader = net.states["a"]
    with pytest.raises(ElectionError, match="not newer"):
        core.publish_plan(leader, _plan(5, 1, ["a"]), net.now)
    leader, _ = core.publish_plan(leader, _plan(1, 2, ["a"]), net.now)
    with pytest.raises(ElectionError, match="not newer"):
        core.publish_plan(leader, _plan(1, 2, ["a", "b"]), net.now)


def test_follower_refuses_stale_heartbeats_and_older_plans() -> None:
    rng = random.Random(0)
    follower = initial_state(config("b"), DurableRecord(3), _plan(3, 4, ["a"]), 0.0, rng)
    state, ack = core.handle_heartbeat(follower, Heartbeat(2, "a", 1), 1.0, rng)
    assert not ack.success
    assert ack.term == 3
    assert state is follower
    old = _plan(3, 2, ["a", "b"])
    state, ack = core.handle_heartbeat(follower, Heartbeat(3, "a", 1, old.fence, old), 1.0, rng)
    assert ack.success
    assert state.plan == follower.plan
    assert ack.plan_fence == PlanFence(3, 4)
    mismatched = _plan(2, 9, ["a"])
    state, _ = core.handle_heartbeat(
        state, Heartbeat(3, "a", 2, mismatched.fence, mismatched), 1, rng
    )
    assert state.plan_fence == PlanFence(3, 4)
    # a second coordinator claiming the same term is refused
    state, ack = core.handle_heartbeat(state, Heartbeat(3, "c", 3), 1.1, rng)
    assert not ack.success
    assert state.coordinator == "a"
    # so is a non-voter claiming to lead
    _, ack = core.handle_heartbeat(follower, Heartbeat(9, "x", 1), 1.2, rng)
    assert not ack.success


def test_events_and_status() -> None:
    net = settled_net(("a", "b", "c"), ("a", "b", "c"))
    before = Net(("a",), ("a", "b", "c")).states["a"]
    kinds = [event.kind for event in events_between(before, net.states["a"], net.now)]
    assert kinds == [ElectionEventKind.ELECTED, ElectionEventKind.COORDINATOR_CHANGED]
    status = status_of(net.states["b"], net.now)
    assert status.to_dict() == {
        "node_id": "b",
        "role": "follower",
        "term": 1,
        "coordinator": "a",
        "lease_valid": True,
        "is_voter": True,
        "plan_fence": None,
    }
    assert not status_of(net.states["b"], net.now + LEASE + 0.01).lease_valid
    stepped, _ = core.on_tick(net.states["a"], net.now + 10, net.rng)
    kinds = [event.kind for event in events_between(net.states["a"], stepped, net.now + 10)]
    assert kinds == [ElectionEventKind.STEPPED_DOWN]


def test_config_validation() -> None:
    with pytest.raises(ElectionError):
        ElectionConfig("a", ())
    with pytest.raises(ElectionError):
        ElectionConfig("a", ("a", "a"))
    with pytest.raises(ElectionError):
        ElectionConfig("a", ("a",), heartbeat_interval_s=2.0, lease_s=1.5)
    assert ElectionConfig("a", ("a", "b", "c", "d")).quorum == 3
    assert not ElectionConfig("x", ("a",)).is_voter
    assert DurableRecord.from_value({"term": 3, "voted_for": "a"}) == DurableRecord(3, "a")
    assert DurableRecord.from_value(None) == DurableRecord()
    for bad in ({"term": -1}, {"term": "3"}, [3], {"term": 1, "voted_for": 5}):
        with pytest.raises(ElectionError):
            DurableRecord.from_value(bad)


def _coordinator(node: str, term: int, now: float) -> ElectionState:
    rng = random.Random(0)
    state = initial_state(config(node), DurableRecord(term - 1), None, now - 10, rng)
    state, _ = core.on_timeout(state, now, rng)
    for voter in ("b", "c"):
        state, _ = core.handle_vote_reply(state, _granted_prevote(term, voter), now, rng)
    for voter in ("b", "c"):
        state, _ = core.handle_vote_reply(state, _granted_vote(term, voter), now, rng)
    assert state.role is ElectionRole.COORDINATOR
    assert state.term == term
    return state


def _granted_prevote(term: int, voter: str = "b") -> VoteReply:
    return VoteReply(term, voter, True, True)


def _granted_vote(term: int, voter: str) -> VoteReply:
    return VoteReply(term, voter, True, False)


def _plan(term: int, version: int, nodes: list[str], highest_generation: int = 0) -> RolePlan:
    members = [
        NodeCapabilities(n, f"10.0.0.{i + 1}", 1, "H100", 80, Role.AUTO)
        for i, n in enumerate(nodes)
    ]
    return compute_plan(
        term, version, members, RolePolicy(1, 2), highest_generation=highest_generation
    )


def test_the_highest_generation_seen_travels_in_plans_acks_and_durable_state() -> None:
    net = settled_net(("a", "b", "c"), ("a", "b", "c"))
    net.advance(0.3)
    leader = net.states["a"]
    plan = _plan(leader.term, next_plan_version(leader), ["a", "b"], highest_generation=6)
    assert plan.generation == 7
    state, out = core.publish_plan(leader, plan, net.now)
    assert state.generation == 7
    net.states["a"] = state
    net.run("a", out)
    # followers adopt the generation with the plan, remember it durably, and report it
    assert net.states["b"].generation == 7
    assert net.states["b"].durable == DurableRecord(1, "a", 7)
    _, ack = core.handle_heartbeat(net.states["c"], Heartbeat(1, "a", 99), net.now, net.rng)
    assert ack.generation == 7
    # a coordinator learns a higher generation from an ack (a plan it never applied)
    state, _ = core.handle_heartbeat_ack(
        net.states["a"], HeartbeatAck(1, "b", 1, True, plan.fence, 11), net.now, net.rng
    )
    assert state.generation == 11
    same_group = _plan(1, plan.version + 1, ["a", "b"], highest_generation=state.generation)
    assert same_group.generation == 12  # the same ranks, yet above 11: 11 may be another group
    # and it refuses to publish a generation below what it has seen
    with pytest.raises(ElectionError, match="below the highest seen, 11"):
        core.publish_plan(state, _plan(1, plan.version + 1, ["a", "b"]), net.now)
    restarted = initial_state(config("b"), DurableRecord(1, "a", 9), None, 0.0, net.rng)
    assert restarted.generation == 9
    with_plan = initial_state(config("b"), DurableRecord(1, "a", 3), plan, 0.0, net.rng)
    assert with_plan.generation == 7


def test_a_pre_vote_denied_for_the_lease_just_after_the_coordinator_fell_silent_retries_soon() -> (
    None
):
    rng = random.Random(0)
    heartbeat = Heartbeat(4, "a", 1, None, None)
    follower = initial_state(config("b"), DurableRecord(4), None, 0.0, rng)
    follower, _ = core.handle_heartbeat(follower, heartbeat, 100.0, rng)
    assert follower.coordinator == "a"
    # b's timer fires one lease after a's last heartbeat; c heard that heartbeat a little later
    candidate, _ = core.on_timeout(follower, 100.0 + LEASE, rng)
    assert candidate.election_deadline >= 100.0 + LEASE + TIMEOUTS.election_min_s
    denied = VoteReply(4, "c", False, True, VoteReason.LEASE.value)
    now = 100.0 + LEASE + 0.01
    soon, _ = core.handle_vote_reply(candidate, denied, now, rng)
    assert soon.election_deadline == pytest.approx(now + TIMEOUTS.heartbeat_interval_s)
    assert soon.role is ElectionRole.CANDIDATE
    assert soon.term == 4  # a pre-vote: nothing else changes
    # another reason, or a coordinator silent for long (we are the one cut off): no hurry
    voted = VoteReply(4, "c", False, True, VoteReason.ALREADY_VOTED.value)
    assert core.handle_vote_reply(candidate, voted, now, rng)[0] == candidate
    late = 100.0 + LEASE + 3 * TIMEOUTS.heartbeat_interval_s
    stale, _ = core.on_timeout(follower, late, rng)
    assert core.handle_vote_reply(stale, denied, late, rng)[0] == stale
