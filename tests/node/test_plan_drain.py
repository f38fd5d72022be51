"""Draining in the role plan: the `draining` field (digest, plans of older releases), the
planner moving a draining node's training rank, gangs, weights groups and workers skipping it,
the lock table keeping drains, jobs refused and killed on a draining node."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from config import Role
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.errors import JobError, PlanError
from node.jobs.drain import DrainKiller, refuse_if_draining
from node.jobs.roster import pick_members
from node.locks.table import Drain, LockTable, drain_map, put_drain
from node.plan import RolePlan
from node.workers.cluster import nodes_of_plan

POLICY = RolePolicy(min_training=1, max_training=1, master_port=29500, backend="gloo")


def cap(node_id: str, preference: Role = Role.AUTO, gpus: int = 0) -> NodeCapabilities:
    return NodeCapabilities(
        node_id=node_id,
        address=f"10.0.0.{ord(node_id[0])}",
        gpu_count=gpus,
        gpu_vram_gb=80.0 * bool(gpus),
        preference=preference,
    )


MEMBERS = [cap("a", gpus=2), cap("b", gpus=1), cap("c", Role.INFERENCE)]


def test_an_older_plan_without_the_field_drains_nobody() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY)
    data = plan.to_dict()
    assert data["draining"] == {}
    del data["draining"]
    old = RolePlan.from_dict(data)
    assert old.draining == {}
    assert not old.is_draining("a")
    assert old.same_assignment(plan)


def test_the_drain_is_part_of_the_digest_and_round_trips() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY)
    drained = compute_plan(1, 2, MEMBERS, POLICY, previous=plan, draining={"c": 30.0})
    assert drained.draining == {"c": 30.0}
    assert drained.training_ranks == plan.training_ranks
    assert drained.digest != plan.digest
    assert not drained.same_assignment(plan)
    again = RolePlan.from_dict(drained.to_dict())
    assert again.draining == {"c": 30.0}
    assert again.digest == drained.digest
    other = compute_plan(1, 2, MEMBERS, POLICY, previous=plan, draining={"c": None})
    assert other.digest != drained.digest


def test_a_draining_node_has_no_training_rank_and_a_malformed_drain_is_refused() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY)
    data = plan.to_dict()
    data["draining"] = {plan.training_ranks[0]: None}
    with pytest.raises(PlanError, match="draining node has no training rank"):
        RolePlan.from_dict(data)
    data["draining"] = {"c": -1}
    with pytest.raises(PlanError, match="kill_after_s"):
        RolePlan.from_dict(data)
    data["draining"] = ["c"]
    with pytest.raises(PlanError, match="draining must map"):
        RolePlan.from_dict(data)


def test_draining_the_training_node_moves_its_rank_in_the_next_plan() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY)
    assert plan.training_ranks == ("a",)
    drained = compute_plan(1, 2, MEMBERS, POLICY, previous=plan, draining={"a": None})
    assert drained.training_ranks == ("b",)
    assert drained.roles["a"] is Role.SELFPLAY
    assert drained.generation > plan.generation
    assert "draining: a" in drained.note
    undrained = compute_plan(1, 3, MEMBERS, POLICY, previous=drained, draining={})
    assert undrained.draining == {}
    assert undrained.training_ranks == ("a",)  # the best node trains again


def test_the_previous_plan_drains_carry_over_while_the_store_is_unread() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY, draining={"a": 5.0})
    assert plan.training_ranks == ("b",)
    carried = compute_plan(2, 1, MEMBERS, POLICY, previous=plan, draining=None)
    assert carried.draining == {"a": 5.0}
    assert carried.training_ranks == ("b",)


def test_nobody_trains_when_only_draining_nodes_could() -> None:
    plan = compute_plan(
        1, 1, [cap("a", gpus=1), cap("c", Role.INFERENCE)], POLICY, draining={"a": None}
    )
    assert plan.training_ranks == ()
    assert plan.draining == {"a": None}


def test_a_draining_node_has_no_weights_group_place() -> None:
    members = [cap("a", Role.TRAINING, 1), cap("c", Role.INFERENCE), cap("d", Role.INFERENCE)]
    plan = compute_plan(1, 1, members, POLICY)
    assert plan.weights_members() == ("a", "c", "d")
    drained = compute_plan(1, 2, members, POLICY, previous=plan, draining={"d": None})
    assert drained.weights_members() == ("a", "c")
    assert drained.weights_generation == plan.weights_generation + 1


@dataclass
class FakeMember:
    node_id: str
    address: str = "127.0.0.1"
    port: int = 1
    state: str = "alive"


def test_gang_members_skip_a_draining_node() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY, draining={"b": None})
    members = [FakeMember("a"), FakeMember("b"), FakeMember("c")]
    picked = pick_members(members, plan, 2, "any")
    assert [m.node_id for m in picked] == ["a", "c"]
    with pytest.raises(JobError, match="draining: b"):
        pick_members(members, plan, 3, "any")


def test_workers_and_actors_skip_a_draining_node() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY, draining={"c": None})
    members = [{"node_id": n, "address": "127.0.0.1", "port": 1, "state": "alive"} for n in "abc"]
    nodes, _, _ = nodes_of_plan({"plan": plan.to_dict()}, members, "any", 1)
    assert [n.node_id for n in nodes] == ["a", "b"]


def test_a_job_start_on_a_draining_node_is_refused_naming_the_drain() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY, draining={"c": None})
    refuse_if_draining(plan, "a")
    refuse_if_draining(None, "c")
    with pytest.raises(JobError) as caught:
        refuse_if_draining(plan, "c")
    assert caught.value.status == 409
    assert caught.value.code == "node_draining"
    assert "shoal node undrain c" in caught.value.reason


def test_the_lock_table_keeps_drains_and_an_older_table_drains_nobody() -> None:
    table = LockTable()
    drained = put_drain(table, 3, "b", Drain(10, 1.0, "op"))
    assert drained.version.to_list() == [3, 1]
    assert put_drain(drained, 3, "b", Drain(10, 1.0, "op")) is drained
    assert drain_map(LockTable.from_dict(drained.to_dict())) == {"b": 10.0}
    old = drained.to_dict()
    del old["drains"]
    assert LockTable.from_dict(old).drains == {}
    undrained = put_drain(drained, 4, "b", None)
    assert drain_map(undrained) == {}
    assert undrained.version.to_list() == [4, 1]
    assert put_drain(undrained, 4, "b", None) is undrained


@dataclass
class FakeState:
    ended: bool


@dataclass
class FakeEntry:
    job_id: str
    state: FakeState


@dataclass
class FakeJobSettings:
    kill_grace_s: float = 3.0


class FakeJobs:
    settings = FakeJobSettings()

    def __init__(self) -> None:
        self.jobs = [FakeEntry("j1", FakeState(False)), FakeEntry("j0", FakeState(True))]
        self.killed: list[tuple[str, str]] = []

    def entries(self) -> list[FakeEntry]:
        return self.jobs

    async def kill(self, job_id: str, signal_name: str, grace_s: float) -> Any:
        self.killed.append((job_id, signal_name))


def test_the_drain_killer_kills_running_jobs_only_after_kill_after_s() -> None:
    now = [100.0]
    plans: list[RolePlan | None] = [compute_plan(1, 1, MEMBERS, POLICY, draining={"c": 5.0})]
    killer = DrainKiller("c", FakeJobs(), lambda: plans[0], clock=lambda: now[0])  # type: ignore[arg-type]
    assert not killer.due(100.0)
    assert not killer.due(104.9)
    assert killer.due(105.0)
    plans[0] = compute_plan(1, 2, MEMBERS, POLICY, draining={})
    assert not killer.due(200.0)  # undrained: the clock starts again at the next drain
    plans[0] = compute_plan(1, 3, MEMBERS, POLICY, draining={"c": None})
    assert not killer.due(300.0)
    assert not killer.due(10_000.0)  # no kill_after_s: jobs finish


async def test_the_drain_killer_task_kills_each_running_job_once() -> None:
    jobs = FakeJobs()
    plan = compute_plan(1, 1, MEMBERS, POLICY, draining={"c": 0.0})
    killer = DrainKiller("c", jobs, lambda: plan)  # type: ignore[arg-type]
    killer.start()
    try:
        async with asyncio.timeout(10):
            while not jobs.killed:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.6)  # two more ticks: no second kill
    finally:
        await killer.close()
    assert jobs.killed == [("j1", "SIGTERM")]


def test_a_draining_node_frees_the_gpus_it_shares_with_another_node() -> None:
    shared = ("GPU-0",)
    members = [
        NodeCapabilities("a", "10.0.0.1", 1, gpu_vram_gb=80.0, gpu_uuids=shared),
        NodeCapabilities("b", "10.0.0.1", 1, gpu_vram_gb=80.0, gpu_uuids=shared),
    ]
    plan = compute_plan(1, 1, members, POLICY)
    assert plan.training_ranks == ("a",)
    assert "b" in plan.cannot_train
    drained = compute_plan(1, 2, members, POLICY, previous=plan, draining={"a": None})
    assert drained.training_ranks == ("b",)
    assert drained.cannot_train == {}
