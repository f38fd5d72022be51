"""What a node does on a peer because of the plan carries the plan's fence, so that a `node`
certificate's call passes the role check (node.identity): a run's job start and kill from the
coordinator, and the kills of a gang's members."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

from node.jobs.gang import GangService
from node.jobs.records import GangMember, JobState
from node.plan import FENCE_HEADER, PlanFence
from node.runs.service import RunService


def test_a_runs_calls_carry_the_coordinators_fence() -> None:
    runtime = SimpleNamespace(term=3, plan_version=7, refresh=lambda: None)
    service = RunService(cast(Any, SimpleNamespace(runtime=runtime)), cast(Any, None), {})
    assert service._fence() == {FENCE_HEADER: "3.7"}
    runtime.plan_version = None
    assert service._fence() == {}


async def test_a_gangs_kills_carry_the_plans_fence() -> None:
    calls: list[tuple[str, str, Mapping[str, str] | None]] = []
    plan = SimpleNamespace(fence=PlanFence(4, 2))
    gang = GangService(
        cast(Any, SimpleNamespace()), cast(Any, SimpleNamespace()), lambda: cast(Any, plan), None
    )

    async def call(
        method: str,
        url: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, Any]:
        calls.append((method, url, headers))
        return 200, {}

    gang._call = call  # type: ignore[method-assign]
    rows = [
        GangMember(
            rank=rank, node=node, url=url, job_id=job, state=JobState.RUNNING,
            exit_code=None, signal=None, reason=None, ended_at=None,
        )
        for rank, (node, url, job) in enumerate(
            [("b", "https://b:1", "j1"), ("c", "https://c:1", "j2")]
        )
    ]  # fmt: skip
    await gang._kill_members(rows, "TERM", 1.0)
    assert sorted(url for _, url, _ in calls) == [
        "https://b:1/v1/jobs/j1/kill",
        "https://c:1/v1/jobs/j2/kill",
    ]
    assert all(headers == {FENCE_HEADER: "4.2"} for _, _, headers in calls)
