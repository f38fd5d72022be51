"""The election as a pure state machine (no I/O, no clock, no tasks): Raft's election rules with
pre-vote, a fixed voter set, and a coordinator lease held only while a majority acknowledges.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import replace

from node.election.messages import (
    Heartbeat,
    HeartbeatAck,
    Message,
    Outbound,
    VoteReason,
    VoteReply,
    VoteRequest,
)
from node.election.spread import plan_deliveries
from node.election.state import (
    ElectionConfig,
    ElectionRole,
    ElectionState,
    PeerFences,
    election_timeout,
    follows_live_coordinator,
    lease_valid,
    stepdown_at,
)
from node.errors import ElectionError
from node.plan import PlanFence, RolePlan, should_apply

Step = tuple[ElectionState, list[Outbound]]
"""The next state and the messages to send, in order. The driver stores `state.durable` (and
`state.plan`) whenever they change, before it sends any of the messages."""


def on_tick(state: ElectionState, now: float, rng: random.Random) -> Step:
    """Time passed: step down without a lease, send due heartbeats, or start an election."""
    if state.role is ElectionRole.COORDINATOR:
        if now >= stepdown_at(state):
            return _become_follower(state, state.term, None, now, rng), []
        if now >= state.next_heartbeat_at:
            return _heartbeat_round(state, now, observers=now >= state.next_observer_heartbeat_at)
        return state, []
    if state.config.is_voter and now >= state.election_deadline:
        return on_timeout(state, now, rng)
    return state, []


def on_timeout(state: ElectionState, now: float, rng: random.Random) -> Step:
    """The election timer fired: ask the voters for pre-votes (term + 1). Non-voters never stand."""
    config = state.config
    if not config.is_voter or state.role is ElectionRole.COORDINATOR:
        return state, []
    state = replace(
        state,
        role=ElectionRole.CANDIDATE,
        pre_vote=True,
        votes=frozenset({config.node_id}),
        coordinator=None,
        election_deadline=now + election_timeout(config, rng),
    )
    if config.quorum == 1:
        return _start_candidacy(state, now, rng)
    request = VoteRequest(state.term + 1, config.node_id, pre_vote=True)
    return state, _to_other_voters(config, request)


def on_message(state: ElectionState, message: Message, now: float, rng: random.Random) -> Step:
    """Any message from a peer; a request's answer is returned addressed to its sender."""
    if isinstance(message, VoteRequest):
        state, reply = handle_vote_request(state, message, now, rng)
        return state, [Outbound(message.candidate, reply)]
    if isinstance(message, Heartbeat):
        state, ack = handle_heartbeat(state, message, now, rng)
        return state, [Outbound(message.coordinator, ack)]
    if isinstance(message, VoteReply):
        return handle_vote_reply(state, message, now, rng)
    return handle_heartbeat_ack(state, message, now, rng)


def handle_vote_request(
    state: ElectionState, request: VoteRequest, now: float, rng: random.Random
) -> tuple[ElectionState, VoteReply]:
    """Grant at most one vote per term, never while following a live coordinator, never as a
    non-voter. A lease denial leaves the term alone, so a returning node cannot disrupt."""
    config = state.config

    def answer(granted: bool, reason: VoteReason) -> VoteReply:
        return VoteReply(state.term, config.node_id, granted, request.pre_vote, reason.value)

    if not config.is_voter:
        return state, answer(False, VoteReason.NOT_VOTER)
    if request.candidate not in config.voters or request.candidate == config.node_id:
        return state, answer(False, VoteReason.UNKNOWN_CANDIDATE)
    if request.term < state.term:
        return state, answer(False, VoteReason.STALE_TERM)
    if follows_live_coordinator(state, now):
        return state, answer(False, VoteReason.LEASE)
    if request.pre_vote:
        if request.term > state.term or state.voted_for in (None, request.candidate):
            granted = VoteReply(request.term, config.node_id, True, True, VoteReason.GRANTED.value)
            return state, granted
        return state, answer(False, VoteReason.ALREADY_VOTED)
    if request.term > state.term:
        state = _become_follower(state, request.term, None, now, rng)
    if state.voted_for not in (None, request.candidate):
        return state, answer(False, VoteReason.ALREADY_VOTED)
    state = replace(
        state,
        voted_for=request.candidate,
        election_deadline=now + election_timeout(config, rng),
    )
    return state, answer(True, VoteReason.GRANTED)


def handle_heartbeat(
    state: ElectionState, heartbeat: Heartbeat, now: float, rng: random.Random
) -> tuple[ElectionState, HeartbeatAck]:
    """Follow the coordinator of a term at least ours; adopt its plan when newer than ours."""
    config = state.config

    def ack(current: ElectionState, success: bool) -> HeartbeatAck:
        fence = current.plan_fence
        return HeartbeatAck(
            current.term,
            config.node_id,
            heartbeat.seq,
            success,
            fence,
            current.generation,
            config.pulls_plans,
        )

    stale = heartbeat.term < state.term
    same_term_other_leader = heartbeat.term == state.term and (
        state.role is ElectionRole.COORDINATOR
        or state.coordinator not in (None, heartbeat.coordinator)
    )
    if stale or same_term_other_leader or heartbeat.coordinator not in config.voters:
        return state, ack(state, False)
    state = _become_follower(state, heartbeat.term, heartbeat.coordinator, now, rng)
    state = replace(state, leader_seen_at=now)
    plan = heartbeat.plan
    if (
        plan is not None
        and plan.term == heartbeat.term
        and should_apply(state.plan_fence, plan.fence)
    ):
        state = replace(state, plan=plan, generation=max(state.generation, plan.generation))
    return state, ack(state, True)


def handle_vote_reply(
    state: ElectionState, reply: VoteReply, now: float, rng: random.Random
) -> Step:
    """Count a (pre-)vote; a majority of pre-votes starts the real election, a majority of
    votes makes this node coordinator. A denial from a higher term makes it a follower."""
    config = state.config
    if reply.term > state.term and not reply.granted:
        return _become_follower(state, reply.term, None, now, rng), []
    if state.role is not ElectionRole.CANDIDATE:
        return state, []
    if not reply.granted:
        return _retry_soon_after_lease_denial(state, reply, now), []
    if reply.voter not in config.voters or reply.pre_vote != state.pre_vote:
        return state, []
    if reply.term != (state.term + 1 if state.pre_vote else state.term):
        return state, []
    state = replace(state, votes=state.votes | {reply.voter})
    if len(state.votes) < config.quorum:
        return state, []
    if state.pre_vote:
        return _start_candidacy(state, now, rng)
    return _become_coordinator(state, now)


def _retry_soon_after_lease_denial(
    state: ElectionState, reply: VoteReply, now: float
) -> ElectionState:
    """A pre-vote denied because the voter heard the old coordinator within its lease, right
    after we stopped hearing it: that voter's window ends about when ours did (the last
    heartbeat reached it a little later), so ask again one heartbeat interval from now, not a
    whole election timeout. A pre-vote changes no state, so asking again is harmless, and only
    for two heartbeat intervals past our own lease: a node cut off from a live coordinator for
    longer does not ask every interval."""
    config = state.config
    if not (state.pre_vote and reply.pre_vote and reply.reason == VoteReason.LEASE.value):
        return state
    seen = state.leader_seen_at
    if seen is None or now - seen > config.lease_s + 2 * config.heartbeat_interval_s:
        return state
    retry_at = now + config.heartbeat_interval_s
    if retry_at >= state.election_deadline:
        return state
    return replace(state, election_deadline=retry_at)


def handle_heartbeat_ack(
    state: ElectionState, ack: HeartbeatAck, now: float, rng: random.Random
) -> Step:
    """Record a follower's acknowledgement; a higher term makes this coordinator step down."""
    if ack.generation > state.generation:
        state = replace(state, generation=ack.generation)
    if ack.term > state.term:
        return _become_follower(state, ack.term, None, now, rng), []
    if state.role is not ElectionRole.COORDINATOR or ack.term != state.term or not ack.success:
        return state, []
    state = _note_follower(state, ack)
    sent = dict(state.rounds).get(ack.seq)
    if sent is None or ack.node not in state.config.voters or ack.node == state.config.node_id:
        return state, []
    if sent <= state.acked.get(ack.node, -math.inf):
        return state, []
    return replace(state, acked={**state.acked, ack.node: sent}), []


def _note_follower(state: ElectionState, ack: HeartbeatAck) -> ElectionState:
    """Record the plan a follower applies and whether it pulls plans; the mappings are copied
    only when they change (a coordinator of thousands hears thousands of acks a second)."""
    node, fences = ack.node, state.peer_fences
    if node not in fences or fences[node] != ack.plan_fence:
        table = fences if isinstance(fences, PeerFences) else PeerFences(fences)
        state = replace(state, peer_fences=table.with_fence(node, ack.plan_fence))
    if ack.pulls_plans == (node in state.whole_plans):
        whole = state.whole_plans - {node} if ack.pulls_plans else state.whole_plans | {node}
        state = replace(state, whole_plans=whole)
    return state


def adopt_fetched_plan(
    state: ElectionState, plan: RolePlan, fence: PlanFence, digest: str
) -> ElectionState:
    """Adopt `plan`, fetched from a member after a heartbeat of this node's coordinator named
    `fence` and `digest`: only that very plan (fence and digest), of this node's term, and
    newer than the one it applies."""
    if (
        plan.fence != fence
        or plan.digest != digest
        or plan.term != state.term
        or state.role is ElectionRole.COORDINATOR
        or not should_apply(state.plan_fence, plan.fence)
    ):
        return state
    return replace(state, plan=plan, generation=max(state.generation, plan.generation))


def publish_plan(state: ElectionState, plan: RolePlan, now: float) -> Step:
    """Adopt `plan` as coordinator and send it to every follower now.

    ElectionError unless this node holds the lease of `plan.term`, the plan is newer, and its
    generation is not below the highest this node has seen.
    """
    if not lease_valid(state, now):
        raise ElectionError(f"{state.config.node_id} holds no coordinator lease; not publishing")
    if plan.term != state.term or not should_apply(state.plan_fence, plan.fence):
        raise ElectionError(f"plan {plan.fence} is not newer within term {state.term}")
    if plan.generation < state.generation:
        raise ElectionError(
            f"plan generation {plan.generation} is below the highest seen, {state.generation}"
        )
    state = replace(
        state,
        plan=plan,
        generation=max(state.generation, plan.generation),
        plan_published_at=now,
        plan_tree_start=state.observer_cursor,
    )
    return _heartbeat_round(state, now, observers=True)


def _start_candidacy(state: ElectionState, now: float, rng: random.Random) -> Step:
    config = state.config
    state = replace(
        state,
        role=ElectionRole.CANDIDATE,
        pre_vote=False,
        term=state.term + 1,
        voted_for=config.node_id,
        votes=frozenset({config.node_id}),
        coordinator=None,
        election_deadline=now + election_timeout(config, rng),
    )
    if config.quorum == 1:
        return _become_coordinator(state, now)
    return state, _to_other_voters(config, VoteRequest(state.term, config.node_id))


def _become_coordinator(state: ElectionState, now: float) -> Step:
    state = replace(
        state,
        role=ElectionRole.COORDINATOR,
        pre_vote=False,
        coordinator=state.config.node_id,
        votes=frozenset(),
        won_at=now,
        rounds=(),
        acked={},
        peer_fences={},
        leader_seen_at=None,
        observer_cursor=None,
        plan_tree_start=None,
    )
    return _heartbeat_round(state, now, observers=True)


def _become_follower(
    state: ElectionState, term: int, coordinator: str | None, now: float, rng: random.Random
) -> ElectionState:
    new_term = term != state.term
    return replace(
        state,
        role=ElectionRole.FOLLOWER,
        pre_vote=False,
        term=term,
        voted_for=None if new_term else state.voted_for,
        coordinator=coordinator,
        votes=frozenset(),
        rounds=(),
        acked={},
        peer_fences={},
        election_deadline=now + election_timeout(state.config, rng),
    )


def _heartbeat_round(state: ElectionState, now: float, observers: bool) -> Step:
    config = state.config
    seq = state.seq + 1
    horizon = now - config.lease_s
    rounds = (*(r for r in state.rounds if r[1] > horizon), (seq, now))
    targets = [voter for voter in config.voters if voter != config.node_id]
    cursor = state.observer_cursor
    if observers:
        due, cursor = observers_due(state)
        targets += due
    plan = state.plan if state.plan is not None and state.plan.term == state.term else None
    if not lease_valid(state, now):
        plan = None
    fence = state.plan_fence
    behind = [] if plan is None else [t for t in targets if state.peer_fences.get(t) != fence]
    grace_s = config.plan_pull_grace_s + config.observer_rotation_s(len(state.observers))
    deliveries = plan_deliveries(
        behind,
        state.observers - state.whole_plans,
        frozenset(config.voters),
        now - state.plan_published_at >= grace_s,
        start=state.plan_tree_start,
    )
    messages = []
    for target in targets:
        delivery = deliveries.get(target)
        if plan is None or delivery is None or delivery.whole:
            whole = plan if delivery is not None else None
            heartbeat = Heartbeat(state.term, config.node_id, seq, fence, whole)
        else:
            heartbeat = Heartbeat(
                state.term, config.node_id, seq, fence, None, plan.digest, delivery.sources
            )
        messages.append(Outbound(target, heartbeat))
    state = replace(
        state,
        seq=seq,
        rounds=rounds,
        observer_cursor=cursor,
        next_heartbeat_at=now + config.heartbeat_interval_s,
        next_observer_heartbeat_at=(
            now + config.observer_interval_s if observers else state.next_observer_heartbeat_at
        ),
    )
    return state, messages


def observers_due(state: ElectionState) -> tuple[list[str], str | None]:
    """The observers of the next observer round, in node id order, and the cursor after it:
    every observer while they fit in `max_observer_heartbeats` (cursor None), else that many,
    from the first after `observer_cursor` on, round to the first again."""
    ordered = sorted(state.observers)
    limit = state.config.max_observer_heartbeats
    if len(ordered) <= limit:
        return ordered, None
    cursor = state.observer_cursor
    start = 0 if cursor is None else bisect_right(ordered, cursor)
    due = (ordered[start:] + ordered[:start])[:limit]
    return due, due[-1]


def _to_other_voters(config: ElectionConfig, message: VoteRequest) -> list[Outbound]:
    return [Outbound(voter, message) for voter in config.voters if voter != config.node_id]
