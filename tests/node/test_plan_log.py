"""The adoption log (fsynced JSON lines) and the checker of every node's log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from node.election.adoption import (
    AdoptionLog,
    AdoptionRecord,
    adoption_record,
    check_adoption_logs,
    read_adoption_log,
)
from node.election.state import ElectionEvent, ElectionEventKind, ElectionRole, ElectionStatus
from node.errors import PlanError
from node.plan import GroupSpec, PlanFence, RolePlan

VOTERS = ("a", "b", "c")


def coord(node: str, term: int, leader: str) -> AdoptionRecord:
    return AdoptionRecord(1.0, node, "coordinator", term, leader)


def plan(
    node: str,
    term: int,
    version: int,
    leader: str = "a",
    digest: str = "d0",
    backers: tuple[str, ...] | None = None,
) -> AdoptionRecord:
    return AdoptionRecord(1.0, node, "plan", term, leader, term, version, digest, backers)


async def test_append_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "a.jsonl"
    records = [coord("a", 1, "a"), plan("a", 1, 1, backers=("a", "b")), plan("a", 1, 2)]
    async with AdoptionLog(path) as log:
        await asyncio.gather(*(log.append(record) for record in records))
    assert read_adoption_log(path) == records
    lines = path.read_text().splitlines()
    assert json.loads(lines[1]) == {
        "time": 1.0,
        "node": "a",
        "kind": "plan",
        "term": 1,
        "coordinator": "a",
        "plan_term": 1,
        "plan_version": 1,
        "plan_digest": "d0",
        "backers": ["a", "b"],
    }


async def test_closed_log_refuses_appends_and_close_is_idempotent(tmp_path: Path) -> None:
    log = AdoptionLog(tmp_path / "a.jsonl")
    await log.append(coord("a", 1, "a"))
    await log.close()
    await log.close()
    with pytest.raises(PlanError, match="closed"):
        await log.append(coord("a", 2, "a"))


def test_torn_last_line_is_skipped_but_damage_elsewhere_is_not(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    good = json.dumps(coord("a", 1, "a").to_dict())
    path.write_text(good + "\n" + '{"time": 1.0, "node": "a", "ki')
    assert read_adoption_log(path) == [coord("a", 1, "a")]
    path.write_text('{"broken\n' + good + "\n")
    with pytest.raises(PlanError, match=r"a\.jsonl:1"):
        read_adoption_log(path)


def test_clean_logs_have_no_violations() -> None:
    logs = {
        "a": [
            coord("a", 1, "a"),
            plan("a", 1, 1, backers=("a", "b")),
            plan("a", 1, 2, digest="d1"),
        ],
        "b": [coord("b", 1, "a"), plan("b", 1, 1), plan("b", 1, 2, digest="d1")],
        "c": [coord("c", 1, "a"), plan("c", 1, 2, digest="d1"), coord("c", 2, "b")],
    }
    assert check_adoption_logs(logs, VOTERS) == []


def test_two_coordinators_in_one_term() -> None:
    logs = {"a": [coord("a", 4, "a")], "b": [coord("b", 4, "b")], "c": [coord("c", 4, "a")]}
    assert check_adoption_logs(logs, VOTERS) == ["term 4: 2 coordinators ['a', 'b']"]


def test_plans_going_backwards_on_a_node() -> None:
    logs = {"b": [plan("b", 2, 5), plan("b", 2, 4), plan("b", 1, 9), plan("b", 2, 5)]}
    problems = check_adoption_logs(logs, VOTERS)
    assert problems == [
        "b: plan 2.4 adopted after 2.5",
        "b: plan 1.9 adopted after 2.5",
        "b: plan 2.5 adopted after 2.5",
    ]


def test_plan_published_without_a_majority() -> None:
    logs = {"a": [plan("a", 3, 1, backers=("a",)), plan("a", 3, 2, backers=("a", "x", "y"))]}
    problems = check_adoption_logs(logs, VOTERS)
    assert len(problems) == 2
    assert all("fewer than 2 of 3 voters" in problem for problem in problems)


def test_two_plans_under_one_fence_and_a_non_voter_coordinator() -> None:
    logs = {"a": [plan("a", 3, 1, digest="x")], "b": [plan("b", 3, 1, digest="y")]}
    assert check_adoption_logs(logs, VOTERS) == ["plan 3.1: 2 different plans under one fence"]
    rogue = {"x": [coord("x", 5, "x")]}
    assert check_adoption_logs(rogue, VOTERS) == ["term 5: coordinator x is not a voter"]


def test_records_from_election_events() -> None:
    role_plan = RolePlan(2, 7, {}, (), GroupSpec("", 29500, 0, "gloo"))
    status = ElectionStatus("a", ElectionRole.COORDINATOR, 2, "a", True, True, PlanFence(2, 7))
    adopted = ElectionEvent(ElectionEventKind.PLAN_ADOPTED, status, role_plan)
    record = adoption_record(adopted, 5.0, ("a", "b"))
    assert record == AdoptionRecord(5.0, "a", "plan", 2, "a", 2, 7, role_plan.digest, ("a", "b"))
    changed = adoption_record(ElectionEvent(ElectionEventKind.COORDINATOR_CHANGED, status), 6.0)
    assert changed == AdoptionRecord(6.0, "a", "coordinator", 2, "a")
    assert adoption_record(ElectionEvent(ElectionEventKind.ELECTED, status), 7.0) is None


GOOD_LINE = AdoptionRecord(1.5, "a", "plan", 3, "a", 3, 2, "d" * 8, ("a", "b")).to_dict()


def test_an_adoption_record_reads_back_from_its_line() -> None:
    line = json.loads(json.dumps(GOOD_LINE))
    assert line == {"time": 1.5, "node": "a", "kind": "plan", "term": 3, "coordinator": "a",
                    "plan_term": 3, "plan_version": 2, "plan_digest": "dddddddd",
                    "backers": ["a", "b"]}  # fmt: skip
    assert AdoptionRecord.from_dict(line).to_dict() == GOOD_LINE


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("time", "soon", "malformed"),
        ("time", None, "time None is not a number"),
        ("term", True, "term True is not an integer"),
        ("term", [3], "term"),
        ("plan_term", "3", "plan_term '3' is not an integer"),
        ("plan_version", 2.5, "plan_version"),
        ("backers", "ab", "backers 'ab' is not a list"),
        ("kind", "king", "kind 'king' is unknown"),
    ],
)
def test_a_malformed_adoption_record_is_refused_naming_its_field(
    field: str, value: object, match: str
) -> None:
    with pytest.raises(PlanError, match=match):
        AdoptionRecord.from_dict({**GOOD_LINE, field: value})


def test_an_adoption_record_without_a_node_is_refused_naming_it() -> None:
    line = {key: value for key, value in GOOD_LINE.items() if key != "node"}
    with pytest.raises(PlanError, match="lacks 'node'"):
        AdoptionRecord.from_dict(line)
