"""The coordinator's judgement of one view of the group: a hung group is restarted (asked once
per generation), a new straggler is an event naming node, rank and GPU, counted in the metrics,
and under `straggler_action: drain` its node is drained, once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from health import BreakerRegistry, NodeMetrics
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.election.state import ElectionRole
from node.runtime import NodeRuntime
from node.training.component import TrainingComponent
from node.training.models import RankProgress, TrainingView
from tests.node.daemons import test_settings

PLAN = compute_plan(
    1,
    1,
    [NodeCapabilities(name, "127.0.0.1", nproc=2) for name in ("a", "b")],
    RolePolicy(min_training=1, max_training=4, backend="gloo"),
)


def component(tmp_path: Path, **settings: Any) -> TrainingComponent:
    runtime = NodeRuntime(
        test_settings(tmp_path, "a", **settings),
        "a",
        "127.0.0.1",
        "0",
        BreakerRegistry(),
        metrics=NodeMetrics("a"),
    )
    elector = SimpleNamespace(
        plan=PLAN,
        state=SimpleNamespace(role=ElectionRole.COORDINATOR),
        notify_membership_changed=lambda: None,
    )
    election = SimpleNamespace(elector=elector, restarts=None, plan_listeners=[], membership=None)
    return TrainingComponent(runtime, election, None)  # type: ignore[arg-type]


def view(hung: bool = False, slow: tuple[int, ...] = ()) -> TrainingView:
    ranks = [
        RankProgress(
            rank=rank,
            node="a" if rank < 2 else "b",
            local_rank=rank % 2,
            generation=PLAN.generation,
            step=9,
            steps_per_s=5.0,
            last_report_age_s=0.1,
            last_advance_age_s=12.5 if hung else 0.1,
            compute_s=0.3 if rank in slow else 0.1,
            straggler=rank in slow,
            gpu=f"GPU-{rank}",
        )
        for rank in range(4)
    ]
    return TrainingView(
        answered_by="a",
        coordinator="a",
        generation=PLAN.generation,
        world_size=4,
        hung=hung,
        hang_timeout_s=10.0,
        ranks=ranks,
        restarts=[],
    )


async def test_a_hung_group_is_restarted_once_per_generation(tmp_path: Path) -> None:
    training = component(tmp_path)
    await training._judge(view(hung=True))
    pending = training.desk.pending()
    assert pending is not None
    assert pending.generation == PLAN.generation
    assert pending.reason == "hang: no rank advanced for 12.5 s (timeout 10 s)"
    await training._judge(view(hung=True))
    assert training.desk.pending() is pending
    await training.close()


async def test_a_new_straggler_is_an_event_a_metric_and_under_drain_a_drained_node(
    tmp_path: Path,
) -> None:
    training = component(tmp_path, straggler_action="drain")
    drained: list[tuple[str, str]] = []

    async def drain(node: str, why: str) -> None:
        drained.append((node, why))

    training.drain = drain
    await training.open()
    await training._judge(view(slow=(2, 3)))
    await training._judge(view(slow=(2, 3)))
    await asyncio.sleep(0)
    assert drained == [("b", "straggler")], "one drain per node, once"
    assert [(e.node, e.rank, e.gpu, e.action) for e in training.events] == [
        ("b", 2, "GPU-2", "drain"),
        ("b", 3, "GPU-3", "drain"),
    ]
    assert training.events[0].median_s == 0.2, "the median of the four ranks"
    assert training.runtime.metrics is not None
    metrics = training.runtime.metrics.render()[0].decode()
    assert 'shoal_training_straggler{node="b",rank="2"} 1.0' in metrics
    assert "shoal_training_stragglers 2.0" in metrics
    await training._judge(view())
    assert training.stragglers == {}
    assert "shoal_training_stragglers 0.0" in training.runtime.metrics.render()[0].decode()
    await training.close()


async def test_a_node_that_does_not_answer_in_time_is_named_missing() -> None:
    from node.training.models import NodeProgress
    from node.training.view import Judging, build_view, gather

    local = NodeProgress(node="a", generation=PLAN.generation, reporting=True, ranks=[])

    async def fetch(node: str, history: bool) -> NodeProgress:
        await asyncio.sleep(10)  # a node that is down answers nothing
        raise AssertionError("not reached")

    parts, missing = await gather(PLAN, local, fetch, 0.2)
    assert (list(parts), missing) == (["a"], ["b"])
    judged = build_view(
        answered_by="a",
        coordinator="a",
        plan=PLAN,
        parts=parts,
        missing=missing,
        judging=Judging(10.0, 60.0, 1.5, 5),
        generation_age_s=1.0,
    )
    assert judged.missing == ["b"]
    assert judged.nodes["b"].reachable is False
    assert judged.nodes["a"].reachable is True
