"""How a new plan reaches many followers (node.election.spread, node.election.pull): whole to a
few, fetched by the others from members that have it, whole again to whoever is left behind,
and whole to followers of the previous release, which do not pull."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from config import Role
from node.election import core
from node.election.elector import Elector
from node.election.messages import Heartbeat, HeartbeatAck
from node.election.pull import PlanWaiters
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.election.seams import InMemoryDurableState, InMemoryElectionNetwork
from node.election.spread import PLAN_FANOUT, plan_deliveries, pull_sources
from node.election.state import (
    DurableRecord,
    ElectionConfig,
    ElectionRole,
    ElectionState,
    PeerFences,
    initial_state,
)
from node.plan import PlanFence

VOTERS = ("c", "v1", "v2")
OBSERVERS = tuple(f"o{i:02d}" for i in range(30))
POLICY = RolePolicy(min_training=1, max_training=40)


def _caps(nodes: tuple[str, ...]) -> list[NodeCapabilities]:
    return [
        NodeCapabilities(n, f"10.0.1.{i + 1}", 1, "L4", 24.0, Role.AUTO)
        for i, n in enumerate(nodes)
    ]


def test_every_member_of_the_tree_serves_at_most_fanout_and_sources_lead_to_a_seed() -> None:
    pullers = [f"p{i:04d}" for i in range(2000)]
    served: dict[str, int] = {}
    for position in range(len(pullers)):
        sources = pull_sources(position, pullers)
        if position < PLAN_FANOUT:
            assert sources == ()
            continue
        assert sources[-1] in pullers[:PLAN_FANOUT]
        assert len(sources) <= 4  # 8 + 64 + 512 + 4096 > 2000: four levels under the seeds
        served[sources[0]] = served.get(sources[0], 0) + 1
    assert max(served.values()) <= PLAN_FANOUT
    assert pull_sources(8, pullers) == ("p0000",)
    assert pull_sources(72, pullers) == ("p0008", "p0000")


def test_deliveries_whole_to_voters_seeds_non_pullers_and_once_overdue() -> None:
    pullers = frozenset(OBSERVERS)
    voters = frozenset(VOTERS)
    targets = [*VOTERS[1:], *OBSERVERS]
    plans = plan_deliveries(targets, pullers - {"o20"}, voters, overdue=False)
    assert all(plans[v].whole for v in VOTERS[1:])
    assert [o for o in OBSERVERS if plans[o].whole] == [*OBSERVERS[:8], "o20"]
    assert plans["o08"].sources == ("o00",)
    assert all(plan.whole for plan in plan_deliveries(targets, pullers, voters, True).values())


def _coordinator() -> ElectionState:
    config = ElectionConfig("c", VOTERS, plan_pull_grace_s=2.0)
    state = initial_state(config, DurableRecord(term=3), None, 0.0, random.Random(1))
    return replace(
        state,
        role=ElectionRole.COORDINATOR,
        coordinator="c",
        acked={"v1": 10.0, "v2": 10.0},
        won_at=10.0,
        observers=frozenset(OBSERVERS),
    )


def test_a_published_plan_goes_whole_to_few_and_as_a_digest_with_sources_to_the_rest() -> None:
    state = _coordinator()
    plan = compute_plan(3, 1, _caps(("c", "v1", "v2", *OBSERVERS)), POLICY)
    old = HeartbeatAck.from_dict(  # the previous release's acknowledgement: no pulls_plans
        {"type": "heartbeat_ack", "term": 3, "node": "o29", "seq": 1, "success": True}
    )
    state, _ = core.handle_heartbeat_ack(state, old, 10.0, random.Random(1))
    state, outbound = core.publish_plan(state, plan, 10.5)
    beats = {item.to: item.message for item in outbound}
    assert isinstance(beats["o10"], Heartbeat)
    whole = sorted(to for to, beat in beats.items() if isinstance(beat, Heartbeat) and beat.plan)
    assert whole == ["o00", "o01", "o02", "o03", "o04", "o05", "o06", "o07", "o29", "v1", "v2"]
    assert beats["o10"].plan_digest == plan.digest
    assert beats["o10"].plan_sources == ("o00",)
    assert beats["o10"].to_dict()["plan_sources"] == ["o00"]
    late, _ = core.on_tick(state, 12.6, random.Random(1))  # past the grace: whole to all behind
    _, again = core.on_tick(replace(late, next_heartbeat_at=0.0), 12.6, random.Random(1))
    assert all(isinstance(b.message, Heartbeat) and b.message.plan for b in again)


def test_acknowledgements_copy_the_follower_tables_only_when_they_change() -> None:
    state = _coordinator()
    ack = HeartbeatAck(3, "o05", 1, True, PlanFence(3, 1), 0, pulls_plans=True)
    once, _ = core.handle_heartbeat_ack(state, ack, 10.0, random.Random(1))
    twice, _ = core.handle_heartbeat_ack(once, ack, 10.1, random.Random(1))
    assert twice.peer_fences is once.peer_fences
    assert twice.whole_plans is once.whole_plans
    old = replace(ack, pulls_plans=False)
    thrice, _ = core.handle_heartbeat_ack(twice, old, 10.2, random.Random(1))
    assert thrice.whole_plans == {"o05"}
    assert thrice.peer_fences is twice.peer_fences


def test_a_fetched_plan_is_adopted_only_when_it_is_the_announced_one() -> None:
    config = ElectionConfig("o10", VOTERS)
    state = replace(initial_state(config, DurableRecord(term=3), None, 0.0, random.Random(1)))
    plan = compute_plan(3, 2, _caps(("c", "o10")), POLICY)
    fence = PlanFence(3, 2)
    assert core.adopt_fetched_plan(state, plan, fence, "0" * 16) is state
    assert core.adopt_fetched_plan(state, plan, PlanFence(3, 3), plan.digest) is state
    assert core.adopt_fetched_plan(replace(state, term=4), plan, fence, plan.digest).plan is None
    assert core.adopt_fetched_plan(state, plan, fence, plan.digest).plan is plan


FAST = {
    "heartbeat_interval_s": 0.03,
    "lease_s": 0.25,
    "election_min_s": 0.3,
    "election_max_s": 0.6,
    "observer_interval_s": 0.06,
    "plan_pull_grace_s": 5.0,
}


@pytest.mark.timeout(60)
async def test_thirty_followers_apply_a_plan_the_coordinator_sent_whole_to_few() -> None:
    network = InMemoryElectionNetwork(random.Random(4), delay_s=(0.001, 0.003))
    nodes = (*VOTERS, *OBSERVERS)
    electors: list[Elector] = []
    try:
        for index, node in enumerate(nodes):
            elector = Elector(
                ElectionConfig(node, VOTERS, **FAST),
                network.transport(node),
                InMemoryDurableState(),
                capabilities=lambda: _caps(nodes),
                policy=POLICY,
                rng=random.Random(index),
            )
            elector.set_observers(OBSERVERS)
            network.register(node, elector)
            await elector.start()
            electors.append(elector)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not all(e.plan is not None and e.plan.term == e.status.term for e in electors):
            assert loop.time() < deadline, "not every follower applied the plan"
            await asyncio.sleep(0.02)
        fences = {e.plan.fence for e in electors if e.plan is not None}
        assert len(fences) == 1
        assert network.plans_fetched >= len(OBSERVERS) - PLAN_FANOUT
        assert network.whole_plans_sent <= 2 * (PLAN_FANOUT + len(VOTERS))
    finally:
        for elector in electors:
            await elector.close()


def test_the_fence_table_reads_as_a_dict_and_shares_what_did_not_change() -> None:
    fences = {f"n{i}": PlanFence(1, i) for i in range(300)}
    table = PeerFences(fences)
    assert dict(table) == fences
    assert len(table) == 300
    after = table.with_fence("n7", PlanFence(2, 1)).with_fence("new", None)
    assert dict(after) == {**fences, "n7": PlanFence(2, 1), "new": None}
    assert len(after) == 301
    assert dict(table) == fences
    assert sum(a is b for a, b in zip(table._shards, after._shards, strict=True)) >= 62


async def test_a_waiting_request_gets_the_plan_it_asked_for_and_never_another() -> None:
    waiters = PlanWaiters()
    plans = {v: compute_plan(3, v, _caps(("c", "o10")), POLICY) for v in (1, 2, 3)}
    current = [plans[1]]
    asked = asyncio.create_task(waiters.plan_at(PlanFence(3, 2), 2.0, lambda: current[0]))
    await asyncio.sleep(0.01)
    assert not asked.done()
    current[0] = plans[2]
    waiters.changed()
    assert await asked is plans[2]
    current[0] = plans[3]  # the asked plan is gone: a newer one is not served in its place
    assert await waiters.plan_at(PlanFence(3, 2), 1.0, lambda: current[0]) is None
    assert await waiters.plan_at(PlanFence(3, 4), 0.05, lambda: current[0]) is None
