"""The whole group's progress, as any node answers it: this node's part and every other
training node's (GET /v1/training/node, all at once, each within a bounded time; a node that
does not answer is named in `missing`), judged by node.training.watch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from node.plan import RolePlan
from node.training.models import (
    NodePart,
    NodeProgress,
    RankHistory,
    Restart,
    StragglerEvent,
    TrainingView,
)
from node.training.watch import GroupState, hang_timeout_s, is_hung, stragglers

FetchPart = Callable[[str, bool], Awaitable[NodeProgress]]
"""GET /v1/training/node of a training node (with its history or not)."""


@dataclass(frozen=True, slots=True)
class Judging:
    """The settings a verdict reads: training_hang_s, how long a new generation may take to
    report first (quorum_s), straggler_factor and straggler_window."""

    hang_s: float
    start_s: float
    straggler_factor: float
    straggler_window: int


async def gather(
    plan: RolePlan | None,
    local: NodeProgress,
    fetch: FetchPart,
    timeout_s: float,
    *,
    history: bool = False,
) -> tuple[dict[str, NodeProgress], list[str]]:
    """(each training node's part by node, the training nodes not read within `timeout_s`):
    this node's own part without a request, the others' all at once."""
    training = () if plan is None else plan.training_ranks
    others = [node for node in training if node != local.node]
    answers = await asyncio.gather(
        *(asyncio.wait_for(fetch(node, history), timeout_s) for node in others),
        return_exceptions=True,
    )
    parts = {local.node: local} if local.node in training else {}
    missing = []
    for node, answer in zip(others, answers, strict=True):
        if isinstance(answer, NodeProgress):
            parts[node] = answer
        else:
            missing.append(node)
    return parts, missing


def build_view(
    *,
    answered_by: str,
    coordinator: str | None,
    plan: RolePlan | None,
    parts: Mapping[str, NodeProgress],
    missing: Iterable[str],
    judging: Judging,
    generation_age_s: float,
    restarts: Iterable[Restart] = (),
    events: Iterable[StragglerEvent] = (),
    committed: JsonValue = None,
    history: bool = False,
) -> TrainingView:
    """The group's document from the parts read: the plan's generation's ranks (stragglers
    flagged), the hang verdict, the restarts and straggler events this node knows."""
    generation = None if plan is None else plan.generation
    ranks = sorted(
        (rank for part in parts.values() for rank in part.ranks if rank.generation == generation),
        key=lambda rank: rank.rank,
    )
    slow, _ = stragglers(ranks, judging.straggler_factor, judging.straggler_window)
    ranks = [rank.model_copy(update={"straggler": rank.rank in slow}) for rank in ranks]
    hang_s = hang_timeout_s(judging.hang_s, ranks)
    state = GroupState(
        ranks=ranks,
        generation_age_s=generation_age_s,
        reporting=any(part.reporting for part in parts.values()),
        running=any(part.workers_running for part in parts.values()),
    )
    missed = sorted(missing)
    nodes = {
        node: NodePart(
            reachable=True, last_restore=part.parts.get("last_restore"), parts=part.parts
        )
        for node, part in parts.items()
    }
    nodes.update({node: NodePart(reachable=False) for node in missed})
    histories: dict[str, RankHistory] | None = None
    if history:
        histories = {k: v for part in parts.values() for k, v in (part.history or {}).items()}
    return TrainingView(
        answered_by=answered_by,
        coordinator=coordinator,
        generation=generation,
        world_size=0 if plan is None else plan.group.world_size,
        hung=is_hung(state, hang_s, judging.start_s),
        hang_timeout_s=round(hang_s, 3),
        ranks=ranks,
        restarts=list(restarts),
        stragglers=list(events),
        missing=missed,
        nodes=nodes,
        committed=committed,
        history=histories,
    )
