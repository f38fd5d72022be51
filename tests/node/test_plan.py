"""Plan fences: which plan a node applies, which fenced request it refuses, and plan JSON."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from config import Role
from node.errors import PlanError
from node.plan import (
    FenceVerdict,
    GroupJson,
    GroupSpec,
    PlanFence,
    RolePlan,
    RolePlanJson,
    check_fence,
    should_apply,
)


def plan(term: int = 2, version: int = 3) -> RolePlan:
    return RolePlan(
        term=term,
        version=version,
        roles={"b": Role.SELFPLAY, "a": Role.TRAINING},
        training_ranks=("a",),
        group=GroupSpec("10.0.0.1", 29500, 1, "gloo"),
        note="1 of 2 members train",
    )


@pytest.mark.parametrize(
    ("current", "incoming", "expected"),
    [
        (None, (0, 0), True),
        ((1, 1), (1, 2), True),
        ((1, 9), (2, 1), True),
        ((2, 1), (2, 1), False),
        ((2, 5), (2, 4), False),
        ((3, 1), (2, 99), False),
    ],
)
def test_should_apply_only_strictly_newer(
    current: tuple[int, int] | None, incoming: tuple[int, int], expected: bool
) -> None:
    assert should_apply(current, incoming) is expected
    fence_current = None if current is None else PlanFence(*current)
    assert should_apply(fence_current, PlanFence(*incoming)) is expected


def test_check_fence_verdicts() -> None:
    ok = check_fence((2, 3), (2, 3))
    assert ok.ok
    assert ok.status == 200
    assert ok.verdict is FenceVerdict.CURRENT
    stale = check_fence(PlanFence(2, 3), PlanFence(2, 2))
    assert not stale.ok
    assert stale.status == 409
    assert stale.verdict is FenceVerdict.STALE
    assert "stale" in stale.reason
    assert "2.3" in stale.reason
    older_term = check_fence((3, 1), (2, 9))
    assert older_term.verdict is FenceVerdict.STALE
    ahead = check_fence((2, 3), (3, 1))
    assert ahead.status == 409
    assert ahead.verdict is FenceVerdict.AHEAD
    assert check_fence((2, 3), None).verdict is FenceVerdict.MISSING
    assert check_fence(None, (1, 1)).verdict is FenceVerdict.NO_PLAN
    assert stale.to_dict() == {
        "verdict": "stale",
        "current": [2, 3],
        "presented": [2, 2],
        "reason": stale.reason,
    }


def test_fence_header_round_trip_and_malformed() -> None:
    fence = PlanFence(12, 4)
    assert fence.to_header() == "12.4"
    assert PlanFence.from_header(" 12.4 ") == fence
    for bad in ("12", "a.b", "1.-2", "", "1.2.3"):
        with pytest.raises(PlanError):
            PlanFence.from_header(bad)
    assert PlanFence.from_value([1, 2]) == PlanFence(1, 2)
    assert PlanFence.from_value(None) is None
    for bad_value in ([1], "1.2", [True, 1], [-1, 0]):
        with pytest.raises(PlanError):
            PlanFence.from_value(bad_value)


def test_plan_dict_form() -> None:
    document = plan().to_dict()
    assert document == {
        "term": 2,
        "version": 3,
        "roles": {"a": "training", "b": "selfplay"},
        "training_ranks": ["a"],
        "local_world_sizes": [1],
        "group": {
            "master_addr": "10.0.0.1",
            "master_port": 29500,
            "world_size": 1,
            "backend": "gloo",
        },
        "generation": 0,
        "cannot_train": {},
        "weights_generation": 0,
        "draining": {},
        "quarantined": {},
        "note": "1 of 2 members train",
    }
    assert RolePlan.from_dict(document) == plan()
    assert plan().fence == PlanFence(2, 3)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"roles": {"a": "boss"}}, "unknown role"),
        ({"roles": {"a": "auto"}}, "only training"),
        ({"training_ranks": ["a", "a"]}, "exactly once"),
        ({"training_ranks": ["b"]}, "exactly once"),
        (
            {
                "group": {
                    "master_addr": "x",
                    "master_port": 1,
                    "world_size": 2,
                    "backend": "gloo",
                }
            },
            "world_size",
        ),
        (
            {
                "group": {
                    "master_addr": "x",
                    "master_port": 1,
                    "world_size": 1,
                    "backend": "mpi",
                }
            },
            "backend",
        ),
        ({"term": -1}, "fence"),
        ({"version": "3"}, "fence"),
        ({"roles": []}, "must be an object"),
        ({"generation": -1}, "generation"),
        ({"cannot_train": {"a": "crashes"}}, "no training rank"),
        ({"cannot_train": {"b": 3}}, "cannot_train"),
    ],
)
def test_malformed_plans_are_refused(change: dict[str, Any], match: str) -> None:
    document = {**plan().to_dict(), **change}
    with pytest.raises(PlanError, match=match):
        RolePlan.from_dict(document)


def test_missing_plan_field_is_named() -> None:
    document = plan().to_dict()
    del document["group"]
    with pytest.raises(PlanError, match="group"):
        RolePlan.from_dict(document)


def test_a_plans_json_has_the_keys_of_role_plan_json_in_its_order() -> None:
    hints = typing.get_type_hints(RolePlanJson)
    quiet = plan().to_dict()
    assert list(quiet) == ["term", "version", *[k for k in hints if k not in
                           ("term", "version", "note", "restart")], "note"]  # fmt: skip
    assert set(quiet["group"]) == set(typing.get_type_hints(GroupJson))
    restarted = dataclasses.replace(plan(), restart="hung").to_dict()
    assert list(restarted)[-2:] == ["restart", "note"]
    assert RolePlan.from_dict(restarted) == dataclasses.replace(plan(), restart="hung")
    with pytest.raises(PlanError, match="generation"):
        RolePlan.from_dict({**quiet, "generation": "4"})
