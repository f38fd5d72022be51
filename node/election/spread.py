"""How a new plan reaches every member without the coordinator sending it to each: the pure rule
of who gets it whole in a heartbeat, and from whom every other member fetches it.

Members that pull plans (their acknowledgements say so) form a tree of `PLAN_FANOUT` children
per member, in node id order: the first `PLAN_FANOUT` (the seeds) get the plan whole; every other
member is told the plan's fence and digest and its ancestors, parent first, and fetches the plan
from the first that has it (node.election.pull). The coordinator thus sends the plan whole about
PLAN_FANOUT times, and no member serves it to more than PLAN_FANOUT others; a member still
behind `plan_pull_grace_s` after the plan was published gets it whole, as do voters and members
of the previous release.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

PLAN_FANOUT = 8
"""Members a member serves a new plan to; also how many get it whole from the coordinator."""


@dataclass(frozen=True, slots=True)
class PlanDelivery:
    """What one heartbeat carries of the plan: `whole`, or the `sources` to fetch it from."""

    whole: bool
    sources: tuple[str, ...] = ()


WHOLE = PlanDelivery(True)


def pull_sources(
    position: int, pullers: Sequence[str], fanout: int = PLAN_FANOUT
) -> tuple[str, ...]:
    """The ancestors of `pullers[position]` in the tree of `fanout` children per member (parent
    first, ending with a seed); () for a seed."""
    sources: list[str] = []
    while position >= fanout:
        position = position // fanout - 1
        sources.append(pullers[position])
    return tuple(sources)


def plan_deliveries(
    targets: Sequence[str],
    pullers: frozenset[str],
    voters: frozenset[str],
    overdue: bool,
    fanout: int = PLAN_FANOUT,
    start: str | None = None,
) -> dict[str, PlanDelivery]:
    """For each of `targets` (members behind the current plan): the plan whole, or where to
    fetch it. Voters, members that do not pull, seeds and everyone once `overdue` (the plan is
    older than the pull grace) get it whole. The tree lists the pullers in node id order, from
    the first after `start` on and round to those up to it (None: from the first)."""
    if overdue or not targets:
        return dict.fromkeys(targets, WHOLE)
    order = sorted(pullers - voters)
    if start is not None:
        cut = bisect_right(order, start)
        order = order[cut:] + order[:cut]
    position = {node: index for index, node in enumerate(order)}
    out: dict[str, PlanDelivery] = {}
    for target in targets:
        index = position.get(target)
        if index is None or index < fanout:
            out[target] = WHOLE
        else:
            out[target] = PlanDelivery(False, pull_sources(index, order, fanout))
    return out
