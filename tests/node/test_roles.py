"""Role assignment as a pure function: preferences, bounds, ties, backends, stable ranks."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from config import HostEntry, Role
from node.election.roles import (
    NodeCapabilities,
    PlanDebouncer,
    RolePolicy,
    capabilities_from_meta,
    compute_plan,
)
from node.errors import PlanError
from node.plan import RolePlan

POLICY = RolePolicy(min_training=1, max_training=4, master_port=29500)


def gpu(
    node_id: str,
    vram: float = 24.0,
    count: int = 1,
    preference: Role = Role.AUTO,
) -> NodeCapabilities:
    return NodeCapabilities(
        node_id=node_id,
        address=f"10.0.0.{sum(map(ord, node_id)) % 250 + 1}",
        gpu_count=count,
        gpu_type="H100",
        gpu_vram_gb=vram,
        preference=preference,
    )


def cpu(node_id: str, preference: Role = Role.AUTO) -> NodeCapabilities:
    return NodeCapabilities(node_id, f"10.1.0.{len(node_id)}", preference=preference)


def test_training_preference_first_then_auto_by_vram() -> None:
    members = [
        gpu("a", vram=80),
        gpu("b", vram=24, preference=Role.TRAINING),
        gpu("c", vram=40),
        gpu("d", vram=80, preference=Role.INFERENCE),
        gpu("e", vram=48, preference=Role.SELFPLAY),
    ]
    plan = compute_plan(3, 7, members, RolePolicy(min_training=1, max_training=3))
    assert plan.training_ranks == ("b", "a", "c")
    assert plan.roles == {
        "a": Role.TRAINING,
        "b": Role.TRAINING,
        "c": Role.TRAINING,
        "d": Role.INFERENCE,
        "e": Role.SELFPLAY,
    }
    assert (plan.term, plan.version) == (3, 7)
    assert plan.group.master_addr == members[1].address
    assert plan.group.world_size == 3
    assert plan.group.backend == "nccl"
    assert plan.rank_of("b") == 0
    assert plan.rank_of("d") is None


def test_max_training_caps_and_auto_leftovers_do_selfplay() -> None:
    members = [gpu(f"n{i}", vram=10 + i) for i in range(6)]
    plan = compute_plan(1, 1, members, RolePolicy(min_training=1, max_training=2))
    assert plan.training_ranks == ("n5", "n4")
    assert [plan.roles[f"n{i}"] for i in range(4)] == [Role.SELFPLAY] * 4


def test_training_preferring_nodes_over_the_cap_do_selfplay() -> None:
    members = [gpu(n, preference=Role.TRAINING) for n in "abc"] + [gpu("z", vram=99)]
    plan = compute_plan(1, 1, members, RolePolicy(min_training=1, max_training=2))
    assert plan.training_ranks == ("a", "b")
    assert plan.roles["c"] is Role.SELFPLAY
    assert plan.roles["z"] is Role.SELFPLAY


def test_ties_break_on_gpu_count_then_node_id() -> None:
    members = [gpu("b", 40, 1), gpu("a", 40, 1), gpu("c", 40, 2), gpu("d", 40, 1)]
    plan = compute_plan(1, 1, members, RolePolicy(min_training=1, max_training=3))
    assert plan.training_ranks == ("c", "a", "b")


def test_prefer_vram_false_orders_by_gpu_count_first() -> None:
    members = [gpu("big", vram=80, count=1), gpu("many", vram=24, count=8)]
    by_vram = compute_plan(1, 1, members, RolePolicy(min_training=1, max_training=1))
    by_count = compute_plan(
        1, 1, members, RolePolicy(min_training=1, max_training=1, prefer_vram=False)
    )
    assert by_vram.training_ranks == ("big",)
    assert by_count.training_ranks == ("many",)


def test_below_min_training_nobody_trains_and_says_why() -> None:
    members = [gpu("a"), gpu("b", preference=Role.INFERENCE), cpu("c")]
    plan = compute_plan(2, 1, members, RolePolicy(min_training=2, max_training=4))
    assert plan.training_ranks == ()
    assert plan.group.world_size == 0
    assert plan.group.master_addr == ""
    assert set(plan.roles.values()) == {Role.SELFPLAY, Role.INFERENCE}
    assert "nobody trains" in plan.note
    assert "min_training is 2" in plan.note


def test_every_node_dead_but_one() -> None:
    survivor = [gpu("last", preference=Role.TRAINING)]
    plan = compute_plan(9, 4, survivor, POLICY)
    assert plan.training_ranks == ("last",)
    assert plan.group.world_size == 1
    assert plan.group.master_addr == survivor[0].address
    lonely = compute_plan(9, 4, [gpu("last", preference=Role.INFERENCE)], POLICY)
    assert lonely.training_ranks == ()
    assert lonely.roles == {"last": Role.INFERENCE}
    empty = compute_plan(9, 4, [], POLICY)
    assert empty.roles == {}
    assert empty.group.world_size == 0


def test_backends() -> None:
    mixed = [gpu("g"), cpu("c", preference=Role.TRAINING)]
    auto = compute_plan(1, 1, mixed, POLICY)
    assert auto.training_ranks == ("c", "g")
    assert auto.group.backend == "gloo"
    nccl = compute_plan(1, 1, mixed, RolePolicy(1, 4, backend="nccl"))
    assert nccl.training_ranks == ("g",)
    assert nccl.group.backend == "nccl"
    cpus = [cpu("x"), cpu("y")]
    assert compute_plan(1, 1, cpus, POLICY).training_ranks == ()
    gloo = compute_plan(1, 1, cpus, RolePolicy(1, 4, backend="gloo"))
    assert gloo.training_ranks == ("x", "y")
    assert gloo.group.backend == "gloo"


def test_member_order_does_not_matter() -> None:
    rng = random.Random(5)
    members = [
        gpu(f"n{i}", vram=rng.choice([24, 40, 80]), count=rng.randint(1, 4)) for i in range(12)
    ]
    first = compute_plan(1, 1, members, POLICY)
    for _ in range(10):
        shuffled = list(members)
        rng.shuffle(shuffled)
        assert compute_plan(1, 1, shuffled, POLICY) == first


def test_surviving_trainers_keep_their_relative_order() -> None:
    members = [gpu("a", 80), gpu("b", 40), gpu("c", 40), gpu("d", 24)]
    first = compute_plan(1, 1, members, POLICY)
    assert first.training_ranks == ("a", "b", "c", "d")
    without_a = compute_plan(1, 2, members[1:], POLICY, previous=first)
    assert without_a.training_ranks == ("b", "c", "d")
    assert without_a.group.master_addr == members[1].address
    joined = compute_plan(1, 3, [*members[1:], gpu("e", 96)], POLICY, previous=without_a)
    assert joined.training_ranks == ("b", "c", "d", "e")
    # a newcomer that outranks everyone still cannot reorder the survivors
    replan = compute_plan(2, 1, [gpu("z", 99), *members[1:]], POLICY, previous=without_a)
    assert replan.training_ranks[:3] == ("b", "c", "d")


def test_stable_ranks_under_random_churn() -> None:
    rng = random.Random(11)
    pool = [gpu(f"n{i:02d}", vram=rng.choice([24, 40, 80])) for i in range(20)]
    previous: RolePlan | None = None
    for version in range(1, 60):
        alive = [cap for cap in pool if rng.random() < 0.7]
        plan = compute_plan(1, version, alive, RolePolicy(2, 6), previous=previous)
        if previous is not None and plan.training_ranks:
            kept = [n for n in previous.training_ranks if n in plan.training_ranks]
            assert list(plan.training_ranks[: len(kept)]) == kept
        assert len(plan.training_ranks) in (0, *range(2, 7))
        previous = plan


def test_plan_json_round_trip_and_digest() -> None:
    members = [gpu("a"), gpu("b", preference=Role.INFERENCE)]
    plan = compute_plan(4, 2, members, POLICY)
    again = RolePlan.from_dict(plan.to_dict())
    assert again == plan
    assert again.digest == plan.digest
    later = compute_plan(5, 1, list(reversed(members)), POLICY)
    assert later.same_assignment(plan)
    assert later.fence > plan.fence


def test_duplicate_members_and_bad_policies_are_refused() -> None:
    with pytest.raises(PlanError, match="listed twice"):
        compute_plan(1, 1, [gpu("a"), gpu("a")], POLICY)
    with pytest.raises(PlanError, match="min_training"):
        RolePolicy(min_training=3, max_training=2)
    with pytest.raises(PlanError, match="master_port"):
        RolePolicy(1, 2, master_port=0)


def test_capabilities_from_meta_falls_back_to_inventory() -> None:
    host = HostEntry(ssh_host="h", gpu="A100", gpu_count=2, gpu_vram_gb=40, role=Role.TRAINING)
    from_host = capabilities_from_meta("a", "10.0.0.1", {"version": "1"}, host)
    assert from_host == NodeCapabilities("a", "10.0.0.1", 2, "A100", 40.0, Role.TRAINING)
    meta = {"role": "inference", "gpu_count": 1, "gpu_vram_gb": 24, "gpu": "L4"}
    from_meta = capabilities_from_meta("a", "10.0.0.1", meta, host)
    assert from_meta == NodeCapabilities("a", "10.0.0.1", 1, "L4", 24.0, Role.INFERENCE)
    junk = capabilities_from_meta("b", "x", {"role": "boss", "gpu_count": True})
    assert junk == NodeCapabilities("b", "x")


def test_debouncer_makes_one_plan_of_a_burst() -> None:
    debounce = PlanDebouncer(quiet_s=0.5, max_wait_s=2.0)
    assert not debounce.pending
    assert debounce.due_at() is None
    debounce = debounce.changed(10.0).changed(10.2).changed(10.4)
    assert debounce.due_at() == pytest.approx(10.9)
    assert not debounce.is_due(10.8)
    assert debounce.is_due(10.9)
    # a steady trickle of changes still produces a plan by max_wait_s
    steady = PlanDebouncer(0.5, 2.0)
    for step in range(10):
        steady = steady.changed(20.0 + step * 0.3)
    assert steady.due_at() == pytest.approx(22.0)
    assert not steady.cleared().pending
    with pytest.raises(PlanError):
        PlanDebouncer(quiet_s=1.0, max_wait_s=0.5)


def test_generation_stays_with_the_group_and_never_repeats() -> None:
    """A -> B -> A: the group with A, then without A, then with A again gets three generations
    (a hash of ranks and group, as before, would repeat the first)."""
    policy = RolePolicy(min_training=1, max_training=1)
    a, b = gpu("a", 80), gpu("b", 40)
    with_a = compute_plan(1, 1, [a, b], policy)
    assert (with_a.training_ranks, with_a.generation) == (("a",), 1)
    # nothing changed, or only the fence: the generation stays (no needless regroup)
    again = compute_plan(1, 2, [a, b], policy, previous=with_a, highest_generation=1)
    assert again.generation == 1
    # a failover keeps the generation when the new coordinator applied the same plan
    new_term = compute_plan(2, 1, [b, a], policy, previous=with_a, highest_generation=1)
    assert new_term.generation == 1
    without_a = compute_plan(2, 2, [b], policy, previous=new_term, highest_generation=1)
    back = compute_plan(3, 1, [a, b], policy, previous=without_a, highest_generation=2)
    assert (without_a.training_ranks, back.training_ranks) == (("b",), ("a",))
    assert back.group == with_a.group
    sequence = [with_a.generation, without_a.generation, back.generation]
    assert sequence == [1, 2, 3]
    # a coordinator that saw a newer generation elsewhere continues above it
    assert compute_plan(4, 1, [a, b], policy, previous=back, highest_generation=9).generation == 10


def test_a_node_that_cannot_train_gives_its_rank_away_with_its_reason() -> None:
    reason = "training command failed 5 times in 300 s; last: exited 1"
    members = [gpu("a", 80, preference=Role.TRAINING), gpu("b", 40), gpu("c", 24)]
    first = compute_plan(1, 1, members, RolePolicy(1, 2))
    assert first.training_ranks == ("a", "b")
    failing = [replace(members[0], cannot_train=reason), *members[1:]]
    plan = compute_plan(1, 2, failing, RolePolicy(1, 2), previous=first, highest_generation=1)
    assert plan.training_ranks == ("b", "c")
    assert plan.role_of("a") is Role.SELFPLAY
    assert dict(plan.cannot_train) == {"a": reason}
    assert plan.generation == 2
    assert RolePlan.from_dict(plan.to_dict()) == plan
    cap = capabilities_from_meta("a", "10.0.0.1", {"cannot_train": reason, "gpu_count": 1})
    assert cap.cannot_train == reason
    assert capabilities_from_meta("a", "10.0.0.1", {"cannot_train": ""}).cannot_train is None


def test_gpuless_auto_cluster_says_how_to_train() -> None:
    members = [cpu("a"), cpu("b")]
    plan = compute_plan(1, 1, members, RolePolicy(min_training=1, max_training=1))
    assert plan.training_ranks == ()
    assert "backend gloo" in plan.note
    gloo = compute_plan(1, 1, members, RolePolicy(min_training=1, max_training=1, backend="gloo"))
    assert gloo.training_ranks == ("a",)
    gpus = [gpu("a", preference=Role.INFERENCE)]
    assert "backend gloo" not in compute_plan(1, 1, gpus, RolePolicy(1, 1)).note
