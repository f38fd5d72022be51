"""The training group's decisions as pure functions: the hang verdict and its timeout, the
stragglers, why two consecutive plans restarted the group, and the forced generation of
compute_plan."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from config import Role
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.plan import RestartRequest, RolePlan
from node.training.models import RankProgress, RestartReason
from node.training.watch import (
    HANG_STEPS,
    GroupState,
    hang_timeout_s,
    is_hung,
    restart_reason,
    stragglers,
)

POLICY = RolePolicy(min_training=1, max_training=4, backend="gloo")


def rank(number: int, **fields: Any) -> RankProgress:
    base: dict[str, Any] = {
        "rank": number,
        "node": f"n{number // 2}",
        "local_rank": number % 2,
        "generation": 1,
        "step": 10,
        "steps_per_s": 10.0,
        "last_report_age_s": 0.1,
        "last_advance_age_s": 0.1,
    }
    return RankProgress(**(base | fields))


def state(*ranks: RankProgress, age_s: float = 100.0, **fields: Any) -> GroupState:
    return GroupState(
        ranks=ranks,
        generation_age_s=age_s,
        reporting=fields.get("reporting", True),
        running=fields.get("running", True),
    )


@pytest.mark.parametrize(
    ("group", "hung"),
    [
        (state(rank(0), rank(1)), False),
        (state(rank(0, last_advance_age_s=11), rank(1, last_advance_age_s=12)), True),
        # one rank still advancing: not hung (the others are behind, not stuck)
        (state(rank(0, last_advance_age_s=11), rank(1, last_advance_age_s=1)), False),
        # exactly at the timeout is not over it
        (state(rank(0, last_advance_age_s=10), rank(1, last_advance_age_s=10)), False),
        # a script that does not report is never judged
        (state(rank(0, last_advance_age_s=99), reporting=False), False),
        # nobody runs workers (finished, backing off): nothing to hang
        (state(rank(0, last_advance_age_s=99), running=False), False),
        # a new generation that never reported: hung only after start_s + hang_s
        (state(age_s=69), False),
        (state(age_s=71), True),
    ],
)
def test_the_hang_verdict(group: GroupState, hung: bool) -> None:
    assert is_hung(group, hang_s=10.0, start_s=60.0) is hung


def test_the_hang_timeout_is_at_least_twenty_median_steps() -> None:
    assert hang_timeout_s(60.0, []) == 60.0
    assert hang_timeout_s(60.0, [rank(0, steps_per_s=10.0)]) == 60.0
    slow = [rank(0, steps_per_s=0.1), rank(1, steps_per_s=0.1), rank(2, steps_per_s=0.0)]
    assert hang_timeout_s(60.0, slow) == pytest.approx(HANG_STEPS * 10.0)


def timed(number: int, median: float, low: float, samples: int = 5) -> RankProgress:
    return rank(number, compute_s=median, compute_min_s=low, compute_samples=samples)


@pytest.mark.parametrize(
    ("ranks", "slow"),
    [
        # one node's two ranks at 3x: they and only they
        (
            [
                timed(0, 0.1, 0.09),
                timed(1, 0.1, 0.1),
                timed(2, 0.3, 0.29),
                timed(3, 0.3, 0.28),
                timed(4, 0.1, 0.1),
                timed(5, 0.11, 0.1),
            ],
            {2, 3},
        ),
        # a slow median but one fast step in the window: not above for the whole window
        ([timed(0, 0.1, 0.1), timed(1, 0.1, 0.1), timed(2, 0.3, 0.12)], set()),
        # fewer samples than the window: not yet
        ([timed(0, 0.1, 0.1), timed(1, 0.1, 0.1), timed(2, 0.3, 0.3, samples=4)], set()),
        # one rank with compute times: no group to compare with
        ([timed(0, 0.3, 0.3), rank(1)], set()),
        ([timed(0, 0.0, 0.0), timed(1, 0.0, 0.0)], set()),
    ],
)
def test_the_stragglers(ranks: list[RankProgress], slow: set[int]) -> None:
    found, _ = stragglers(ranks, factor=1.5, window=5)
    assert found == slow


def trainers(*names: str) -> list[NodeCapabilities]:
    return [NodeCapabilities(name, f"10.0.0.{i + 1}", nproc=2) for i, name in enumerate(names)]


def plan_of(*names: str, previous: RolePlan | None = None, **changes: Any) -> RolePlan:
    plan = compute_plan(1, 1, trainers(*names), POLICY, previous=previous)
    return replace(plan, **changes) if changes else plan


def test_a_forced_restart_gives_a_new_generation_with_its_reason_once() -> None:
    first = plan_of("a", "b", "c")
    same = compute_plan(1, 2, trainers("a", "b", "c"), POLICY, previous=first)
    assert same.generation == first.generation
    request = RestartRequest(first.generation, "hang: no rank advanced for 61.0 s")
    forced = compute_plan(1, 3, trainers("a", "b", "c"), POLICY, first, restart=request)
    assert forced.generation == first.generation + 1
    assert forced.restart == request.reason
    assert RolePlan.from_dict(forced.to_dict()).restart == request.reason
    # the request is stale once its generation is gone: the plan keeps its generation and reason
    again = compute_plan(1, 4, trainers("a", "b", "c"), POLICY, forced, restart=request)
    assert (again.generation, again.restart) == (forced.generation, forced.restart)
    moved = compute_plan(1, 5, trainers("a", "b"), POLICY, forced)
    assert moved.restart == "", "a generation the coordinator did not force has no reason"
    assert "restart" not in moved.to_dict(), "an older release reads the plan as before"


def test_a_forced_restart_stays_above_every_generation_seen() -> None:
    first = plan_of("a", "b")
    request = RestartRequest(first.generation, "worker_exit")
    forced = compute_plan(
        2, 1, trainers("a", "b"), POLICY, first, highest_generation=9, restart=request
    )
    assert forced.generation == 10


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        # the coordinator forced it: its reason and detail
        (
            {"restart": "hang: no rank advanced for 12.0 s"},
            (RestartReason.HANG, "no rank advanced for 12.0 s"),
        ),
        (
            {"restart": "worker_exit"},
            (RestartReason.WORKER_EXIT, "forced by the coordinator (worker_exit)"),
        ),
        # a training node died: it is not a member any more
        ({"nodes": ("a", "b"), "others": {}}, (RestartReason.MEMBER_LOST, "c")),
        # its GPU was quarantined (it stays a member)
        (
            {"nodes": ("a", "b"), "others": {"c": "gpu_fault: Xid 79 on GPU-5d8f0e1c-2a"}},
            (RestartReason.GPU_FAULT, "c: gpu_fault: Xid 79 on GPU-5d8f0e1c-2a"),
        ),
        # its training command kept failing: the launcher gave up
        (
            {"nodes": ("a", "b"), "others": {"c": "training command failed 5 times"}},
            (RestartReason.WORKER_EXIT, "c: training command failed 5 times"),
        ),
        # drained, or its GPU is claimed by another node: a plan change
        ({"nodes": ("a", "b"), "others": {"c": ""}}, (RestartReason.PLAN_CHANGE, "c")),
        (
            {"nodes": ("a", "b"), "others": {"c": "GPU GPU-1 is also claimed by a"}},
            (RestartReason.PLAN_CHANGE, "c: GPU GPU-1 is also claimed by a"),
        ),
        ({"nodes": ("a", "b", "c", "d")}, (RestartReason.PLAN_CHANGE, "joined: d")),
    ],
)
def test_why_the_group_restarted(
    after: dict[str, Any], expected: tuple[RestartReason, str]
) -> None:
    before = plan_of("a", "b", "c")
    nodes = after.get("nodes", ("a", "b", "c"))
    plan = plan_of(*nodes, previous=before)
    if "others" in after:
        roles = {**plan.roles, **dict.fromkeys(after["others"], Role.SELFPLAY)}
        unable = {node: why for node, why in after["others"].items() if why}
        plan = replace(plan, roles=roles, cannot_train=unable)
    if "restart" in after:
        plan = replace(plan, generation=before.generation + 1, restart=after["restart"])
    assert restart_reason(before, plan) == expected


def test_a_member_lost_wins_over_a_gpu_fault_and_the_same_generation_is_no_restart() -> None:
    before = plan_of("a", "b", "c")
    plan = plan_of("a", previous=before)
    plan = replace(
        plan, roles={**plan.roles, "c": Role.SELFPLAY}, cannot_train={"c": "gpu_fault: Xid 48"}
    )
    assert restart_reason(before, plan) == (RestartReason.MEMBER_LOST, "b")
    assert restart_reason(before, before) is None
    assert restart_reason(None, before) is None
    nobody = compute_plan(1, 1, [], POLICY)
    assert restart_reason(nobody, before) is None, "the first group is a start, not a restart"
