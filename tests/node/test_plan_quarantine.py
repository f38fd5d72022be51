"""GPU quarantine in the role plan and the lock table: the `quarantined` field (digest, plans of
older releases), the planner taking a quarantined node's rank away with its reason in
`cannot_train`, the table's quarantine, re-admission, limit and lift (pure functions)."""

from __future__ import annotations

import pytest

from config import Role
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.errors import LockError, PlanError
from node.locks.quarantines import WINDOW_S, lift, quarantine, quarantine_map, readmit
from node.locks.table import Drain, LockTable, put_drain
from node.plan import RolePlan

POLICY = RolePolicy(min_training=1, max_training=3, master_port=29500, backend="gloo")
REASON = "gpu_fault: Xid 79 on GPU-5d8f0e1c-2a"


def cap(node_id: str, preference: Role = Role.AUTO, nproc: int = 2) -> NodeCapabilities:
    return NodeCapabilities(
        node_id=node_id,
        address=f"10.0.0.{ord(node_id[0])}",
        gpu_count=nproc,
        gpu_vram_gb=80.0,
        preference=preference,
        nproc=nproc,
    )


MEMBERS = [cap("a"), cap("b"), cap("c"), cap("d", Role.INFERENCE)]


def test_a_quarantined_node_leaves_the_training_group_with_its_reason() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY)
    assert plan.training_ranks == ("a", "b", "c")
    assert plan.group.world_size == 6
    out = compute_plan(1, 2, MEMBERS, POLICY, previous=plan, quarantined={"b": REASON})
    assert out.training_ranks == ("a", "c")
    assert out.group.world_size == 4
    assert out.cannot_train == {"b": REASON}
    assert out.quarantined == {"b": REASON}
    assert out.roles["b"] is Role.SELFPLAY
    assert out.generation > plan.generation
    assert "quarantined: b" in out.note
    assert not out.same_assignment(plan)
    # the restart's reason, from two plans: a rank of the first is quarantined in the second
    assert out.quarantined_trainers(plan) == ("b",)
    assert out.quarantined_trainers(None) == ()
    assert plan.quarantined_trainers(out) == ()
    back = compute_plan(1, 3, MEMBERS, POLICY, previous=out, quarantined={})
    assert back.quarantined == {}
    assert back.training_ranks == ("a", "c", "b")
    assert back.cannot_train == {}


def test_the_previous_plans_quarantines_carry_over_while_the_table_is_unread() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY, quarantined={"a": REASON})
    carried = compute_plan(2, 1, MEMBERS, POLICY, previous=plan, quarantined=None)
    assert carried.quarantined == {"a": REASON}
    assert "a" not in carried.training_ranks


def test_a_quarantined_node_that_is_no_member_is_kept_in_the_field_only() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY, quarantined={"gone": REASON})
    assert plan.quarantined == {"gone": REASON}
    assert plan.cannot_train == {}
    assert plan.training_ranks == ("a", "b", "c")


def test_a_quarantined_node_has_no_weights_group_place() -> None:
    members = [cap("a", Role.TRAINING), cap("c", Role.INFERENCE), cap("d", Role.INFERENCE)]
    plan = compute_plan(1, 1, members, POLICY, quarantined={"d": REASON})
    assert plan.weights_members() == ("a", "c")


def test_the_field_round_trips_and_an_older_plan_quarantines_nobody() -> None:
    plan = compute_plan(1, 1, MEMBERS, POLICY, quarantined={"c": REASON})
    data = plan.to_dict()
    assert data["quarantined"] == {"c": REASON}
    again = RolePlan.from_dict(data)
    assert again.quarantined == {"c": REASON}
    assert again.digest == plan.digest
    plain = compute_plan(1, 1, MEMBERS, POLICY)
    old = plain.to_dict()
    del old["quarantined"]
    assert RolePlan.from_dict(old).quarantined == {}
    assert RolePlan.from_dict(old).same_assignment(plain)
    data["quarantined"] = {"a": REASON}
    with pytest.raises(PlanError, match="quarantined node has no training rank"):
        RolePlan.from_dict(data)
    data["quarantined"] = ["c"]
    with pytest.raises(PlanError, match="quarantined must map"):
        RolePlan.from_dict(data)
    data["quarantined"] = {"d": 5}
    with pytest.raises(PlanError, match="quarantined must map"):
        RolePlan.from_dict(data)


# the lock table


def test_a_quarantine_is_kept_and_a_repeated_report_changes_nothing() -> None:
    table = LockTable()
    out, record, new = quarantine(table, 3, "b", REASON, 100.0, 3)
    assert new
    assert (record.reason, record.since, record.active, record.held) == (REASON, 100.0, True, False)
    assert out.version.to_list() == [3, 1]
    assert quarantine_map(out) == {"b": REASON}
    again, same, new = quarantine(out, 3, "b", "gpu_fault: Xid 48 on GPU-x", 101.0, 3)
    assert (again, same, new) == (out, record, False)
    stored = LockTable.from_dict(out.to_dict())
    assert stored.quarantines == out.quarantines
    older = out.to_dict()
    del older["quarantines"]
    assert LockTable.from_dict(older).quarantines == {}
    # the other changes of the table keep it
    assert quarantine_map(put_drain(out, 3, "c", Drain(None))) == {"b": REASON}


def test_readmission_and_the_limit_within_the_window() -> None:
    table = LockTable()
    at = 1000.0
    for count in (1, 2):
        table, record, _ = quarantine(table, 1, "b", REASON, at, 3)
        assert (len(record.times), record.held) == (count, False)
        table, back = readmit(table, 1, "b", at + 10)
        assert back
        assert quarantine_map(table) == {}
        at += 100
    assert readmit(table, 1, "b", at) == (table, False)  # not quarantined: nothing to do
    table, record, _ = quarantine(table, 1, "b", REASON, at, 3)
    assert record.held
    assert quarantine_map(table)["b"].startswith(f"{REASON} (quarantined 3 times within 1 h")
    with pytest.raises(LockError) as caught:
        readmit(table, 1, "b", at + 10)
    assert (caught.value.status, caught.value.code) == (409, "quarantine_held")
    assert "shoal node undrain b" in caught.value.reason
    lifted = lift(table, 2, "b")
    assert lifted.quarantines == {}
    assert lifted.version.to_list() == [2, 1]
    assert lift(lifted, 2, "b") is lifted
    # after an undrain the count starts again
    again, record, _ = quarantine(lifted, 2, "b", REASON, at + 20, 3)
    assert (len(record.times), record.held) == (1, False)
    del again


def test_quarantines_older_than_the_window_do_not_count() -> None:
    table = LockTable()
    at = 0.0
    for _ in range(2):
        table, _, _ = quarantine(table, 1, "b", REASON, at, 3)
        table, _ = readmit(table, 1, "b", at + 1)
    at += WINDOW_S + 5
    table, record, _ = quarantine(table, 1, "b", REASON, at, 3)
    assert (record.times, record.held) == ((at,), False)
    table, _ = readmit(table, 1, "b", at + 1)
    table, _, _ = quarantine(table, 1, "c", REASON, at + WINDOW_S + 10, 3)
    assert set(table.quarantines) == {"c"}  # b's old history is dropped
