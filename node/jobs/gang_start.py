"""Starting a gang: the coordinator's pick body and route, the master port probe, and the start
of the members (member 0 on a free master port, then the rest with that port)."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from config.declare import Refusal
from net import peer_url
from node.errors import JobError, PlanError
from node.jobs.documents import JobSpecJson, Role
from node.jobs.records import GangMember, JobState, PickAnswer
from node.jobs.roster import GANG_PORT_ATTEMPTS, gang_master_port, pick_members
from node.openapi import BODY_CONFIG, WholeNumber
from node.plan import FENCE_HEADER, FenceVerdict, PlanFence, RolePlan, check_fence
from node.runtime import NodeRuntime

PICK_PATH = "/v1/jobs/gang/pick"
FENCE_RETRY_S = 3.0

CallFn = Callable[..., Awaitable[tuple[int, Any]]]
"""`GangService._call`: (method, url, body, headers) -> (status, JSON body); JobError(502)."""


def port_is_free(port: int) -> bool:
    """True when a TCP listener could bind `port` on every address of this host now (IPv4, and
    IPv6 where the host has it), as rank 0's TCPStore will: False when it is in use."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):  # noqa: S104 (a probe, closed at once)
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((address, port))
                sock.listen(1)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False
    return True


PICK_ERRORS = (
    Refusal(400, "invalid_pick", "malformed request"),
    Refusal(409, "not_coordinator", "not the coordinator"),
    Refusal(503, "not_enough_nodes", "too few nodes"),
)
"""What the coordinator's pick (POST /v1/jobs/gang/pick) refuses."""
RETRIED_FENCES = frozenset({"fence_refused", "fence_ahead"})
"""A member's refusal of the gang's fence that a retry may lift: it has not applied the plan yet
(its start route's own check, or node.identity's check of a `fenced` route)."""
STALE_FENCE = "stale_fence"
"""A member's refusal of the gang's fence as older than its plan: only a new pick lifts it."""
FENCE_REFUSALS = RETRIED_FENCES | {STALE_FENCE}
"""Every refusal of a request's fence (409) by a node that applies another plan."""


@dataclass(frozen=True)
class MemberFailure:
    """A member that could not start: its row, why, and the member's error code (None when it
    did not answer with one)."""

    row: GangMember
    reason: str
    code: str | None

    @property
    def stale_fence(self) -> bool:
        """Whether the member refused the pick's fence as stale (the plan moved on)."""
        return self.code == STALE_FENCE


class PickBody(BaseModel):
    """Body of `POST /v1/jobs/gang/pick`: how many alive nodes of which role."""

    model_config = BODY_CONFIG

    nodes: WholeNumber = Field(ge=1, le=1024, description="the gang's size, 1 to 1024")
    role: Role = Field(default="any", description="the members' role, or any")


def coordinator_pick(
    runtime: NodeRuntime, plan: RolePlan | None, nodes: int, role: str
) -> PickAnswer:
    """The coordinator's choice of members; JobError 409 on any other node."""
    if runtime.coordinator != runtime.node_id or plan is None:
        raise JobError(
            409,
            "not_coordinator",
            f"node {runtime.node_id} is not the coordinator (it is {runtime.coordinator}); "
            "ask the coordinator",
        )
    members = runtime.membership.members() if runtime.membership is not None else []
    return PickAnswer(
        fence=plan.fence.to_header(), members=tuple(pick_members(members, plan, nodes, role))
    )


def check_member_fence(plan: RolePlan | None, header: str | None) -> None:
    """Refuse a gang member's start whose plan fence (`header`) is malformed (JobError 400) or
    not accepted by this node's plan (JobError 409)."""
    try:
        presented = PlanFence.from_header(header) if header else None
    except PlanError as exc:
        raise JobError(400, "bad_fence", f"{FENCE_HEADER}: {exc}") from exc
    result = check_fence(plan.fence if plan is not None else None, presented)
    if not result.ok:
        code = "stale_fence" if result.verdict is FenceVerdict.STALE else "fence_refused"
        raise JobError(409, code, f"gang member start refused: {result.reason}")


def fence_is_newer(fence: str, than: str) -> bool:
    """Whether plan fence `fence` (term.version) is newer than `than`; False when either is
    malformed."""
    try:
        return PlanFence.from_header(fence) > PlanFence.from_header(than)
    except PlanError:
        return False


def member_url(runtime: NodeRuntime, node_id: str) -> str:
    """The base URL of `node_id` in this node's membership view; JobError 503 when absent."""
    members = runtime.membership.members() if runtime.membership is not None else []
    for member in members:
        if member.node_id == node_id:
            return peer_url(member.address, member.port)
    raise JobError(
        503,
        "unknown_node",
        f"node {node_id} is not in the membership view of {runtime.node_id}; "
        "retry once membership has converged",
    )


class MemberStarts:
    """The starts of one gang's members over `call`; `rows` holds each member's row, updated
    with its state once it started."""

    def __init__(
        self,
        call: CallFn,
        gang_id: str,
        owner: str,
        spec: JobSpecJson,
        pick: PickAnswer,
        rows: list[GangMember],
    ) -> None:
        self._call = call
        self._gang_id = gang_id
        self._owner = owner
        self._pick = pick
        self.rows = rows
        self._base = {
            "name": spec["name"],
            "argv": spec["argv"],
            "env": spec["env"],
            "cwd": spec["cwd"],
            "timeout_s": spec["timeout_s"],
            "role": spec["role"],
            "env_from": spec["env_from"],
        }

    async def start_one(self, rank: int, master_port: int) -> tuple[str | None, str | None]:
        """(None, None) once member `rank` started, else (the reason, the member's error code)."""
        row = self.rows[rank]
        gang = {
            "job_id": self._gang_id,
            "rank": rank,
            "nodes": len(self.rows),
            "master_addr": self._pick.members[0].address,
            "master_port": master_port,
            "owner": self._owner,
        }
        body = {**self._base, "job_id": row.job_id, "nodes": 1, "gang": gang}
        deadline = time.monotonic() + FENCE_RETRY_S
        while True:
            try:
                status, answer = await self._call(
                    "POST", f"{row.url}/v1/jobs", body, {FENCE_HEADER: self._pick.fence}
                )
            except JobError as exc:
                return exc.reason, exc.code
            if status in (200, 201):
                state = answer.get("state", JobState.RUNNING.value)
                self.rows[rank] = row.model_copy(update={"state": JobState(state)})
                return None, None
            error = answer.get("error") if isinstance(answer, dict) else None
            code = error if isinstance(error, str) else None
            if code in RETRIED_FENCES and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the member has not applied the plan yet
                continue
            reason = answer.get("reason", answer) if isinstance(answer, dict) else answer
            return f"HTTP {status}: {reason}", code

    async def start_master(self, base_port: int) -> tuple[int, MemberFailure | None]:
        """Start member 0 on the first candidate port free on its host: (the master port, None)
        once started, else (the last port tried, member 0's failure)."""
        tried: list[int] = []
        error: str | None = None
        code: str | None = None
        master_port = gang_master_port(base_port, self._gang_id)
        for attempt in range(GANG_PORT_ATTEMPTS):
            master_port = gang_master_port(base_port, self._gang_id, attempt)
            error, code = await self.start_one(0, master_port)
            if code != "master_port_busy":
                break
            tried.append(master_port)
        if code == "master_port_busy":
            ports = ", ".join(map(str, tried))
            error = f"gang master ports {ports} are all in use there"
        if error is None:
            return master_port, None
        return master_port, MemberFailure(self.rows[0], error, code)

    async def start_rest(self, master_port: int) -> list[MemberFailure]:
        """Start the members after 0 with `master_port`: the failed ones, with why."""
        rest = self.rows[1:]
        results = await asyncio.gather(*(self.start_one(row.rank, master_port) for row in rest))
        return [
            MemberFailure(row, reason, code)
            for row, (reason, code) in zip(rest, results, strict=True)
            if reason is not None
        ]
