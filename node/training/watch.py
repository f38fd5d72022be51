"""The decisions about a training group, as pure functions over what its nodes report: is it
hung, which ranks straggle, and why did two consecutive plans restart it."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from node.plan import RolePlan
from node.training.models import RankProgress, RestartReason

HANG_STEPS = 20
"""The hang timeout is at least this many median step times (a slow step is not a hang)."""
GPU_FAULT_PREFIX = "gpu_fault"
"""How a quarantined node's `cannot_train` reason starts (node.election's GPU quarantine)."""
GPU_CLAIM_PREFIX = "GPU "
"""How a GPU claimed by two nodes reads in `cannot_train` (a configuration, not a fault)."""


def hang_timeout_s(configured_s: float, ranks: Sequence[RankProgress]) -> float:
    """The effective hang timeout: `training_hang_s`, or HANG_STEPS median step times of the
    ranks that advance, whichever is longer."""
    rates = [rank.steps_per_s for rank in ranks if rank.steps_per_s > 0]
    if not rates:
        return configured_s
    return max(configured_s, HANG_STEPS / statistics.median(rates))


@dataclass(frozen=True, slots=True)
class GroupState:
    """What the hang verdict reads of one generation: its ranks' progress, how long ago it
    started, whether its script reports at all (some rank reported since the daemons started)
    and whether any node runs its workers now."""

    ranks: Sequence[RankProgress]
    generation_age_s: float
    reporting: bool
    running: bool


def is_hung(state: GroupState, hang_s: float, start_s: float) -> bool:
    """True when no rank advanced for `hang_s`, or when no rank reported at all within
    `start_s + hang_s` of the generation's start (joining and restoring take up to start_s).
    Never for a script that does not report, or while no node runs workers."""
    if not state.reporting or not state.running:
        return False
    if not state.ranks:
        return state.generation_age_s > start_s + hang_s
    return min(rank.last_advance_age_s for rank in state.ranks) > hang_s


def stragglers(
    ranks: Sequence[RankProgress], factor: float, window: int
) -> tuple[frozenset[int], float | None]:
    """(the straggling ranks, the group's median compute seconds): a rank straggles when each
    of its last `window` compute times is above `factor` times the median of the ranks' own
    medians. Needs two ranks with compute times."""
    medians = [rank.compute_s for rank in ranks if rank.compute_s is not None]
    if len(medians) < 2:
        return frozenset(), None
    median = statistics.median(medians)
    if median <= 0:
        return frozenset(), median
    slow = frozenset(
        rank.rank
        for rank in ranks
        if rank.compute_samples >= window
        and rank.compute_min_s is not None
        and rank.compute_min_s > factor * median
    )
    return slow, median


def _lost_reason(node: str, plan: RolePlan) -> RestartReason:
    """Why `node`, a training node of the previous plan, has no rank in `plan`."""
    if node not in plan.roles:
        return RestartReason.MEMBER_LOST
    quarantined: Mapping[str, str] = getattr(plan, "quarantined", {})
    reason = plan.cannot_train.get(node, "")
    if node in quarantined or reason.startswith(GPU_FAULT_PREFIX):
        return RestartReason.GPU_FAULT
    if reason and not reason.startswith(GPU_CLAIM_PREFIX):
        return RestartReason.WORKER_EXIT  # its launcher gave up: the command keeps failing
    return RestartReason.PLAN_CHANGE


_PRECEDENCE = (
    RestartReason.MEMBER_LOST,
    RestartReason.GPU_FAULT,
    RestartReason.WORKER_EXIT,
    RestartReason.PLAN_CHANGE,
)


def restart_reason(previous: RolePlan | None, plan: RolePlan) -> tuple[RestartReason, str] | None:
    """Why `plan` restarted the group `previous` ran, with a detail naming the nodes; None when
    it did not (the same generation, or nobody trained before). A restart the coordinator forced
    (plan.restart) gives its own reason; otherwise the nodes that lost their rank say why: dead
    or gone (member_lost), a quarantined GPU (gpu_fault), a launcher that gave up
    (worker_exit), anything else (plan_change), the first of these that applies."""
    if previous is None or previous.generation == plan.generation or not previous.training_ranks:
        return None
    if plan.restart:
        head, _, detail = plan.restart.partition(": ")
        known = head in {reason.value for reason in RestartReason}
        forced = RestartReason(head) if known else RestartReason.PLAN_CHANGE
        return forced, detail or f"forced by the coordinator ({plan.restart})"
    lost = [node for node in previous.training_ranks if node not in plan.training_ranks]
    if not lost:
        joined = [node for node in plan.training_ranks if node not in previous.training_ranks]
        detail = f"joined: {', '.join(joined)}" if joined else "the group changed"
        return RestartReason.PLAN_CHANGE, detail
    reasons = {node: _lost_reason(node, plan) for node in lost}
    reason = next(r for r in _PRECEDENCE if r in reasons.values())
    named = [node for node, why in reasons.items() if why is reason]
    causes = [(node, plan.cannot_train.get(node, "")) for node in named]
    return reason, ", ".join(f"{node}: {why}" if why else node for node, why in causes)
