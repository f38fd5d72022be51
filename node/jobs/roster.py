"""Who runs a gang and how it ended: pure decisions of gang jobs (no sockets, no files)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from node.errors import JobError
from node.jobs.records import MAX_JOB_ID_CHARS, GangMember, JobState, PickedNode, invalid
from node.plan import RolePlan

GANG_PORT_BASE_OFFSET = 1500
GANG_PORT_SPAN = 1000
GANG_PORT_ATTEMPTS = 8
"""Candidate MASTER_PORTs a gang tries on member 0's host before it gives up."""
GANG_START_ATTEMPTS = 3
"""Picks a gang start makes when a member refuses the pick's fence as stale (the plan moved on
between the coordinator's pick and the member's start), each with member job ids of its own."""
GANG_RESTART_S = 5.0
"""No new start attempt of a gang begins this long after its first pick (the start answers the
caller within its HTTP request timeout)."""


def gang_master_port(base_port: int, gang_id: str, attempt: int = 0) -> int:
    """Candidate `attempt` (0, 1, ...) for the MASTER_PORT of a gang: a port per gang id above
    the training rendezvous ports, the next ones (wrapping within the span) for later attempts."""
    digest = int(hashlib.sha256(gang_id.encode()).hexdigest()[:8], 16)
    return base_port + GANG_PORT_BASE_OFFSET + (digest + attempt) % GANG_PORT_SPAN


def pick_members(
    members: Sequence[Any], plan: RolePlan | None, nodes: int, role: str
) -> list[PickedNode]:
    """K alive members for a gang of `role`: for training, the plan's ranks first; then the
    others of that role by node id; never a node the plan drains. JobError(503) when fewer
    than `nodes` qualify."""
    alive = [
        m
        for m in members
        if str(m.state) == "alive" and (plan is None or not plan.is_draining(m.node_id))
    ]

    def role_of(node_id: str) -> str | None:
        found = plan.role_of(node_id) if plan is not None else None
        return None if found is None else str(found)

    chosen = [m for m in alive if role == "any" or role_of(m.node_id) == role]

    def order(member: Any) -> tuple[int, int, str]:
        rank = plan.rank_of(member.node_id) if plan is not None and role == "training" else None
        return (0, rank, member.node_id) if rank is not None else (1, 0, member.node_id)

    chosen.sort(key=order)
    if len(chosen) < nodes:
        raise JobError(
            503,
            "not_enough_nodes",
            f"a gang of {nodes} {role} nodes was asked for, but {len(chosen)} alive nodes have "
            f"that role ({', '.join(m.node_id for m in chosen) or 'none'})"
            + (
                f" and are not draining (draining: {', '.join(plan.draining)})"
                if plan is not None and plan.draining
                else ""
            )
            + "; ask for fewer",
        )
    return [
        PickedNode(node_id=m.node_id, address=m.address, port=int(m.port)) for m in chosen[:nodes]
    ]


def check_gang_id(gang_id: str, nodes: int) -> None:
    """JobError (400) when a member job id of gang `gang_id` on `nodes` nodes, in any start
    attempt, would be longer than a job id may be (128 characters)."""
    longest = member_job_id(gang_id, nodes - 1, GANG_START_ATTEMPTS - 1)
    if len(longest) > MAX_JOB_ID_CHARS:
        room = MAX_JOB_ID_CHARS - (len(longest) - len(gang_id))
        raise invalid(
            f"job_id of a gang of {nodes} nodes must be at most {room} characters: its members "
            f"are the jobs <job_id>.<rank>[.a<attempt>] (up to {longest[len(gang_id) :]!r}), "
            f"and a job id is at most {MAX_JOB_ID_CHARS}; this one is {len(gang_id)}"
        )


def member_job_id(gang_id: str, rank: int, attempt: int = 0) -> str:
    """The job id of member `rank` in start attempt `attempt` (0, 1, ...) of gang `gang_id`:
    `<gang>.<rank>` in the first, `<gang>.<rank>.a<attempt>` in a later one, so a member of a
    stopped attempt is never taken for a member of the next."""
    return f"{gang_id}.{rank}" if attempt == 0 else f"{gang_id}.{rank}.a{attempt}"


def gang_outcome(
    members: Sequence[GangMember], killed: bool
) -> tuple[JobState, int | None, str | None]:
    """(state, exit_code, reason) of a gang whose members all ended."""
    failed = [m for m in members if m.state is not JobState.SUCCEEDED]
    if not failed:
        return JobState.SUCCEEDED, 0, None
    first = min(failed, key=lambda m: (m.ended_at or float("inf"), m.rank))
    if killed:
        return JobState.KILLED, None, "the gang was killed"
    why = first.reason or first.state.value
    return (
        JobState.FAILED,
        first.exit_code,
        f"member rank {first.rank} on {first.node} {first.state.value}: {why}",
    )
