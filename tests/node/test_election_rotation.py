"""A coordinator of more observers than one round may heartbeat (`max_observer_heartbeats`): the
observers take turns, the voters' heartbeats (the lease) go out every round as before, a new
plan's pull tree follows the order the rotation reaches the pullers in, and the pull grace waits
one rotation longer. At or under the limit nothing changes (docs/scale.md)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from config import Role
from node.election import core
from node.election.messages import Heartbeat, HeartbeatAck, Outbound, VoteReason, VoteReply
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.election.spread import PLAN_FANOUT, plan_deliveries
from node.election.state import (
    DurableRecord,
    ElectionConfig,
    ElectionRole,
    ElectionState,
    initial_state,
    lease_valid,
)
from node.errors import ElectionError
from node.plan import RolePlan

VOTERS = ("c", "v1", "v2")
OBSERVERS = tuple(f"o{i:03d}" for i in range(100))
LIMIT = 30


def _coordinator(limit: int = LIMIT, observers: tuple[str, ...] = OBSERVERS) -> ElectionState:
    config = ElectionConfig("c", VOTERS, plan_pull_grace_s=2.0, max_observer_heartbeats=limit)
    state = initial_state(config, DurableRecord(term=3), None, 0.0, random.Random(1))
    return replace(
        state,
        role=ElectionRole.COORDINATOR,
        coordinator="c",
        acked={"v1": 10.0, "v2": 10.0},
        won_at=10.0,
        observers=frozenset(observers),
    )


def _plan(observers: tuple[str, ...] = OBSERVERS) -> RolePlan:
    nodes = ("c", "v1", "v2", *observers)
    caps = [
        NodeCapabilities(n, f"10.0.{i // 250}.{i % 250 + 1}", 1, "L4", 24.0, Role.AUTO)
        for i, n in enumerate(nodes)
    ]
    return compute_plan(3, 1, caps, RolePolicy(min_training=1, max_training=len(nodes)))


def _to(outbound: list[Outbound]) -> list[str]:
    return [item.to for item in outbound]


def _observer_round(state: ElectionState, now: float) -> tuple[ElectionState, list[str]]:
    """A tick at `now` that is due for an observer round: the state after it and its targets."""
    due = replace(state, next_observer_heartbeat_at=now, next_heartbeat_at=now)
    state, outbound = core.on_tick(due, now, random.Random(1))
    return state, _to(outbound)


def _pulling(state: ElectionState) -> ElectionState:
    """Every observer acknowledged saying it pulls plans."""
    for seq, node in enumerate(sorted(state.observers), 1):
        ack = HeartbeatAck(3, node, seq, True, None, 0, True)
        state, _ = core.handle_heartbeat_ack(state, ack, 10.0, random.Random(1))
    return state


def test_observers_take_turns_past_the_limit_and_voters_hear_every_round() -> None:
    state = _coordinator()
    heard: list[str] = []
    now = 10.0
    for _ in range(8):  # 8 observer rounds of 30: two turns of 100 observers, and some
        state, targets = _observer_round(state, now)
        assert targets[:2] == ["v1", "v2"]  # the lease's heartbeats first, every round
        assert len(targets) == 2 + LIMIT
        heard += targets[2:]
        now += state.config.heartbeat_interval_s
        state = replace(state, acked={"v1": now, "v2": now})
    assert heard[:100] == sorted(OBSERVERS)  # a turn: each observer once, in node id order
    assert heard[100:200] == sorted(OBSERVERS)
    assert heard[90:110] == [*OBSERVERS[90:], *OBSERVERS[:10]]  # round to the first again


def test_a_voter_round_between_observer_rounds_heartbeats_only_the_voters() -> None:
    state = _coordinator()
    state, first = _observer_round(state, 10.0)
    assert len(first) == 2 + LIMIT
    state, second = core.on_tick(state, 10.15, random.Random(1))
    assert _to(second) == ["v1", "v2"]
    assert state.observer_cursor == OBSERVERS[LIMIT - 1]  # a voter round moves no turn on


def test_at_or_under_the_limit_every_observer_hears_every_observer_round() -> None:
    state = _coordinator(limit=len(OBSERVERS))
    for now in (10.0, 10.6, 11.2):
        state, targets = _observer_round(state, now)
        assert targets == ["v1", "v2", *sorted(OBSERVERS)]
        assert state.observer_cursor is None
        state = replace(state, acked={"v1": now, "v2": now})


def test_a_new_plans_tree_starts_where_the_turn_is_so_parents_hear_before_children() -> None:
    state = _pulling(_coordinator())
    state, _ = _observer_round(state, 10.0)
    state, _ = _observer_round(state, 10.1)
    assert state.observer_cursor == OBSERVERS[2 * LIMIT - 1]
    plan = _plan()
    state = replace(state, acked={"v1": 10.2, "v2": 10.2})
    state, outbound = core.publish_plan(state, plan, 10.2)
    assert state.plan_tree_start == OBSERVERS[2 * LIMIT - 1]
    beats = [(item.to, item.message) for item in outbound]
    assert all(isinstance(beat, Heartbeat) for _, beat in beats)
    observers = [(to, beat) for to, beat in beats if to not in VOTERS]
    assert [to for to, _ in observers] == [*OBSERVERS[60:90]]
    hinted: set[str] = set()
    for position, (to, beat) in enumerate(observers):
        assert isinstance(beat, Heartbeat)
        if position < PLAN_FANOUT:
            assert beat.plan is not None  # the seeds: the first the rotation reaches
        else:
            assert beat.plan is None
            assert beat.plan_digest == plan.digest
            assert beat.plan_sources
            assert beat.plan_sources[0] in hinted
        hinted.add(to)


def test_the_pull_grace_waits_one_rotation_longer() -> None:
    state = _pulling(_coordinator())
    plan = _plan()
    state, _ = core.publish_plan(state, plan, 10.0)
    rotation_s = state.config.observer_rotation_s(len(OBSERVERS))
    assert rotation_s == 3 * state.config.observer_interval_s  # 100 observers, 30 a round

    def observer_round(at: float) -> list[Heartbeat]:
        ticked = replace(
            state, acked={"v1": at, "v2": at}, next_observer_heartbeat_at=at, next_heartbeat_at=at
        )
        _, outbound = core.on_tick(ticked, at, random.Random(1))
        beats = [item.message for item in outbound if item.to not in VOTERS]
        assert all(isinstance(beat, Heartbeat) for beat in beats)
        return beats  # type: ignore[return-value]

    within = observer_round(10.0 + 2.0 + rotation_s - 0.01)
    assert sum(beat.plan is not None for beat in within) < len(within)  # still pulled
    past = observer_round(10.0 + 2.0 + rotation_s)
    assert all(beat.plan is not None for beat in past)  # overdue: whole to whoever is behind


def test_a_new_coordinator_starts_the_turns_from_the_first_observer() -> None:
    state = replace(_coordinator(), observer_cursor="o050", plan_tree_start="o050")
    state = replace(
        state, role=ElectionRole.CANDIDATE, pre_vote=False, term=4, votes=frozenset({"c"})
    )
    reply = VoteReply(4, "v1", True, False, VoteReason.GRANTED.value)
    state, outbound = core.handle_vote_reply(state, reply, 20.0, random.Random(1))
    assert state.role is ElectionRole.COORDINATOR
    assert not lease_valid(state, 20.0)
    assert state.plan_tree_start is None
    assert _to(outbound) == ["v1", "v2", *OBSERVERS[:LIMIT]]


def test_the_tree_order_starts_after_start() -> None:
    pullers = frozenset(OBSERVERS)
    deliveries = plan_deliveries(list(OBSERVERS), pullers, frozenset(VOTERS), False, start="o095")
    seeds = [o for o in OBSERVERS if deliveries[o].whole]
    assert seeds == ["o000", "o001", "o002", "o003", "o096", "o097", "o098", "o099"]
    assert deliveries["o004"].sources == ("o096",)  # position 8 of o096, o097, ..., o003, o004
    unrotated = plan_deliveries(["o010"], pullers, frozenset(VOTERS), False)
    assert unrotated["o010"].sources == ("o000",)


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ElectionError, match="max_observer_heartbeats"):
        ElectionConfig("c", VOTERS, max_observer_heartbeats=0)
