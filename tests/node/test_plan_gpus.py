"""Node-major training groups and GPU ownership in the role plan: local world sizes, rank
offsets, plans of older releases, and the rule that no two ranks share a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from config import Role
from node.election.claims import (
    GPU_UUIDS_META,
    META_TEXT_CHARS,
    gpu_claim_id,
    gpu_conflicts,
    gpu_uuids_from_meta,
    gpu_uuids_meta,
)
from node.election.roles import (
    CANNOT_TRAIN_META,
    NPROC_META,
    NodeCapabilities,
    RolePolicy,
    capabilities_from_meta,
    compute_plan,
    next_generation,
)
from node.membership.types import MAX_META_TEXT_CHARS, MemberState, Update
from node.membership.wire import encode_update
from node.plan import GroupSpec, PlanError, RolePlan
from node.training.launching import CANNOT_TRAIN_REASON_CHARS

POLICY = RolePolicy(min_training=1, max_training=8, master_port=29500)


def node(
    node_id: str, nproc: int = 1, uuids: tuple[str, ...] = (), preference: Role = Role.AUTO
) -> NodeCapabilities:
    return NodeCapabilities(
        node_id=node_id,
        address=f"10.0.0.{ord(node_id[0])}",
        gpu_count=len(uuids),
        gpu_type="H100" if uuids else None,
        gpu_vram_gb=80.0 if uuids else 0.0,
        preference=preference,
        gpu_uuids=uuids,
        nproc=nproc,
    )


def test_two_processes_per_node_make_a_node_major_group() -> None:
    members = [node("a", 2, ("GPU-a0", "GPU-a1")), node("b", 2, ("GPU-b0", "GPU-b1"))]
    plan = compute_plan(1, 1, members, POLICY)
    assert plan.training_ranks == ("a", "b")
    assert plan.local_world_sizes == (2, 2)
    assert plan.group.world_size == 4
    assert plan.group.backend == "nccl"
    assert [plan.node_rank_of(n) for n in "ab"] == [0, 1]
    assert [plan.rank_offset_of(n) for n in "ab"] == [0, 2]
    assert [plan.local_world_size_of(n) for n in "ab"] == [2, 2]
    assert plan.rank_of("b") == 1  # the node's place, as before
    assert plan.weights_members() == ("a",)  # the publisher is node rank 0 (global rank 0)


def test_uneven_processes_offset_by_the_nodes_before() -> None:
    members = [node("a", 3, ("A0", "A1", "A2")), node("b", 1, ("B0",)), node("c", 2, ("C0", "C1"))]
    plan = compute_plan(1, 1, members, replace(POLICY, prefer_vram=False))
    assert plan.training_ranks == ("a", "c", "b")
    assert plan.local_world_sizes == (3, 2, 1)
    assert [plan.rank_offset_of(n) for n in plan.training_ranks] == [0, 3, 5]
    assert plan.group.world_size == 6


def test_a_node_that_does_not_train_has_no_ranks() -> None:
    members = [node("a", 2, ("A0", "A1")), node("z", 4, (), Role.INFERENCE)]
    plan = compute_plan(1, 1, members, POLICY)
    assert plan.node_rank_of("z") is None
    assert plan.rank_offset_of("z") is None
    assert plan.local_world_size_of("z") == 0
    assert plan.local_world_size_of("nobody") == 0


def test_a_plan_dict_without_local_world_sizes_means_one_process_per_node() -> None:
    plan = compute_plan(3, 4, [node("a"), node("b")], replace(POLICY, backend="gloo"))
    old = plan.to_dict()
    del old["local_world_sizes"]
    parsed = RolePlan.from_dict(old)
    assert parsed.local_world_sizes == (1, 1)
    assert parsed == plan
    assert parsed.rank_offset_of("b") == 1


def test_local_world_sizes_round_trip_and_change_the_digest() -> None:
    two = compute_plan(1, 1, [node("a", 2, ("A0", "A1")), node("b", 2, ("B0", "B1"))], POLICY)
    assert two.to_dict()["local_world_sizes"] == [2, 2]
    assert RolePlan.from_dict(two.to_dict()) == two
    shifted = replace(two, local_world_sizes=(3, 1))
    assert shifted.group.world_size == 4
    assert not shifted.same_assignment(two)


def test_a_change_of_processes_makes_a_new_generation() -> None:
    pair = [node("a", 2, ("A0", "A1")), node("b", 2, ("B0", "B1"))]
    first = compute_plan(1, 1, pair, POLICY)
    same = compute_plan(1, 2, pair, POLICY, first)
    assert same.generation == first.generation
    members = [node("a", 1, ("A0", "A1")), node("b", 3, ("B0", "B1", "B2"))]
    moved = compute_plan(1, 3, members, POLICY, first)
    assert moved.group == first.group  # same world size, master and backend
    assert moved.generation == first.generation + 1
    assert next_generation(("a", "b"), first.group, first, 0, (2, 2)) == first.generation
    assert next_generation(("a", "b"), first.group, first, 0, (1, 3)) == first.generation + 1


@pytest.mark.parametrize(
    ("sizes", "world", "message"),
    [
        ((2,), 2, "1 entries for 2 training nodes"),
        ((2, 0), 2, "must be integers >= 1"),
        ((2, 2), 3, "world_size 3 must equal the sum of local_world_sizes \\(4\\)"),
        ((), 3, "world_size 3 must equal the sum of local_world_sizes \\(2\\)"),
    ],
)
def test_a_plan_refuses_local_world_sizes_that_do_not_add_up(
    sizes: tuple[int, ...], world: int, message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        RolePlan(
            term=1,
            version=1,
            roles={"a": Role.TRAINING, "b": Role.TRAINING},
            training_ranks=("a", "b"),
            group=GroupSpec("10.0.0.1", 29500, world, "gloo"),
            local_world_sizes=sizes,
        )


def test_a_plan_dict_with_a_malformed_local_world_sizes_is_refused() -> None:
    document = compute_plan(1, 1, [node("a")], replace(POLICY, backend="gloo")).to_dict()
    with pytest.raises(PlanError, match="local_world_sizes must be a list"):
        RolePlan.from_dict(document | {"local_world_sizes": "2"})


def _claims(node_id: str, *uuids: str, nproc: int = 1) -> NodeCapabilities:
    meta = {"gpu_count": len(uuids), "gpu_vram_gb": 80.0, NPROC_META: nproc}
    return capabilities_from_meta(node_id, "10.0.0.9", meta | gpu_uuids_meta(uuids))


def test_the_later_node_claiming_a_gpu_gets_no_rank() -> None:
    members = [_claims("b", "GPU-1", "GPU-2"), _claims("a", "GPU-0", "GPU-1")]
    plan = compute_plan(2, 1, members, POLICY)
    assert plan.training_ranks == ("a",)
    assert plan.cannot_train == {"b": "GPU GPU-1 is also claimed by a"}
    assert plan.to_dict()["cannot_train"] == {"b": "GPU GPU-1 is also claimed by a"}
    assert plan.roles["b"] is Role.SELFPLAY


def test_a_gpu_claimed_by_three_nodes_stays_with_the_first() -> None:
    members = [_claims("c", "U"), _claims("a", "U"), _claims("b", "U"), _claims("d", "V")]
    plan = compute_plan(2, 1, members, replace(POLICY, backend="gloo"))
    assert plan.training_ranks == ("a", "d")
    assert plan.cannot_train == {
        "b": "GPU U is also claimed by a",
        "c": "GPU U is also claimed by a",
    }


def test_nodes_with_disjoint_gpus_both_train() -> None:
    plan = compute_plan(2, 1, [_claims("a", "GPU-0", nproc=1), _claims("b", "GPU-1")], POLICY)
    assert plan.training_ranks == ("a", "b")
    assert plan.cannot_train == {}


def test_a_training_node_claiming_a_gpu_still_gets_no_rank() -> None:
    later = replace(_claims("b", "GPU-0"), preference=Role.TRAINING)
    plan = compute_plan(2, 1, [_claims("a", "GPU-0"), later], POLICY)
    assert plan.training_ranks == ("a",)
    assert "b" in plan.cannot_train


def test_gpuless_nodes_train_only_where_the_backend_allows() -> None:
    members = [_claims("a", "GPU-0"), _claims("b")]
    assert compute_plan(1, 1, members, POLICY).training_ranks == ("a",)
    assert compute_plan(1, 1, members, replace(POLICY, backend="nccl")).training_ranks == ("a",)
    gloo = compute_plan(1, 1, members, replace(POLICY, backend="gloo"))
    assert gloo.training_ranks == ("a", "b")
    assert gloo.group.backend == "gloo"


def test_long_gpu_ids_fit_the_meta_values_and_read_back_in_order() -> None:
    assert META_TEXT_CHARS == MAX_META_TEXT_CHARS
    uuids = [f"MIG-{i:08x}-1111-2222-3333-444455556666/{i}/0" for i in range(16)]
    meta = gpu_uuids_meta(uuids)
    assert next(iter(meta)) == GPU_UUIDS_META
    assert len(meta) > 1
    assert all(len(value) <= MAX_META_TEXT_CHARS for value in meta.values())
    assert gpu_uuids_from_meta(meta) == tuple(uuids)
    assert gpu_uuids_meta([]) == {}
    assert gpu_uuids_from_meta({}) == ()
    with pytest.raises(PlanError, match="cannot be advertised"):
        gpu_uuids_meta(["a,b"])


def test_capabilities_read_uuids_and_processes_from_meta() -> None:
    cap = capabilities_from_meta("a", "10.0.0.1", {GPU_UUIDS_META: "U0,U1", NPROC_META: 2})
    assert (cap.gpu_uuids, cap.nproc) == (("U0", "U1"), 2)
    older = capabilities_from_meta("a", "10.0.0.1", {"gpu_count": 1})
    assert (older.gpu_uuids, older.nproc) == ((), 1)
    for bad in (0, -1, "2", True):
        assert capabilities_from_meta("a", "10.0.0.1", {NPROC_META: bad}).nproc == 1
    with pytest.raises(PlanError, match="nproc 0 must be >= 1"):
        NodeCapabilities("a", "10.0.0.1", nproc=0)


NVML_UUID = "GPU-5D8F0E1C-2a3b-4c5d-8e9f-0123456789ab"


def test_nvml_uuids_are_advertised_by_their_first_ten_hex_digits() -> None:
    assert gpu_claim_id(NVML_UUID) == "GPU-5d8f0e1c-2a"
    assert NVML_UUID.lower().startswith(gpu_claim_id(NVML_UUID).lower())
    assert gpu_claim_id("GPU-not-a-uuid") == "GPU-not-a-uuid"
    meta = gpu_uuids_meta([NVML_UUID, "GPU-other"])
    assert meta == {GPU_UUIDS_META: "5d8f0e1c2a,GPU-other"}
    assert gpu_uuids_from_meta(meta) == ("GPU-5d8f0e1c-2a", "GPU-other")


def test_the_same_nvml_gpu_on_two_nodes_is_a_conflict() -> None:
    other = NVML_UUID.replace("5D8F0E1C", "11111111")
    plan = compute_plan(2, 1, [_claims("a", NVML_UUID), _claims("b", other, NVML_UUID)], POLICY)
    assert plan.training_ranks == ("a",)
    assert plan.cannot_train == {"b": "GPU GPU-5d8f0e1c-2a is also claimed by a"}


def test_eight_gpus_and_a_long_cannot_train_reason_still_gossip() -> None:
    uuids = [f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]
    meta = {
        "version": "0.9.0.dev0+g1234567",
        "role": "auto",
        "cluster": "a-cluster-name",
        "config_hash": "abcdef123456",
        "gpu_count": 8,
        "gpu": "NVIDIA H100 80GB HBM3",
        "gpu_vram_gb": 79.6,
        NPROC_META: 8,
        CANNOT_TRAIN_META: "x" * CANNOT_TRAIN_REASON_CHARS,
        **gpu_uuids_meta(uuids),
    }
    update = Update("gpu-node-17.example.org", MemberState.ALIVE, 12, "10.20.30.40", 8770, meta)
    assert len(encode_update(update)) <= 600  # what Membership.update_meta accepts


def test_gpu_conflicts_keep_each_gpu_with_its_first_claimant() -> None:
    claims = {"c": ("W", "U"), "a": ("U", "U"), "b": ("V", "W"), "d": ("X",)}
    assert gpu_conflicts(claims) == {"c": "GPU W is also claimed by b"}
    assert gpu_conflicts({"a": ("U",), "b": ("V",)}) == {}
