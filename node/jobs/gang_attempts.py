"""Starting a gang: pick its members, start every one or none, and when members refuse the
pick's fence as stale (the plan moved on between the pick and their start), stop the attempt's
members and start a new pick with member job ids of the next attempt (node.jobs.gang's
GangService runs it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from node.errors import JobError
from node.jobs.gang_start import (
    FENCE_REFUSALS,
    FENCE_RETRY_S,
    MemberFailure,
    MemberStarts,
    fence_is_newer,
)
from node.jobs.records import GangMember, GangRecord, JobRequest, JobState, PickAnswer
from node.jobs.roster import GANG_RESTART_S, GANG_START_ATTEMPTS, member_job_id
from node.jobs.store import JobEntry
from node.plan import FENCE_HEADER, RolePlan
from node.runtime import NodeRuntime

log = logging.getLogger(__name__)

REPICK_PAUSE_S = 0.2
"""The pause before asking the coordinator again when its pick is not newer than the fence a
member refused as stale (the newer plan has not reached it yet)."""

Call = Callable[..., Awaitable[tuple[int, Any]]]
"""GangService._call: one signed request to a peer, (status, JSON body)."""


def _members(entry: JobEntry) -> tuple[GangMember, ...]:
    return () if entry.gang is None else entry.gang.members


class GangAttempts:
    """The start of this node's gangs: `run` picks and starts, `stop_members` stops an
    attempt's members."""

    def __init__(
        self,
        runtime: NodeRuntime,
        write_gang: Callable[[JobEntry], None],
        plan: Callable[[], RolePlan | None],
        call: Call,
        ask_pick: Callable[[int, str], Awaitable[PickAnswer]],
        url_of: Callable[[str], str],
    ) -> None:
        self._runtime = runtime
        self._write_gang = write_gang
        """The job store's write of a gang's record (a blocking file write)."""
        self._plan = plan
        self._call = call
        self._ask_pick = ask_pick
        self._url_of = url_of

    async def run(self, entry: JobEntry, request: JobRequest) -> None:
        """Pick and start every member, or none. When members refuse the pick's fence as stale
        (the plan moved on between the pick and their start), the gang is picked again under
        the current plan, the attempt's members are stopped and the new pick is started with
        member job ids of the next attempt: up to GANG_START_ATTEMPTS picks, none begun after
        GANG_RESTART_S. JobError, with the attempt's members stopped, when a member cannot start
        for another reason or the attempts run out."""
        began = time.monotonic()
        deadline = began + GANG_RESTART_S
        pick = await self._ask_pick(request.nodes, request.role)
        attempt = 0
        while True:
            failures = await self._start_members(entry, request, pick, attempt)
            if not failures:
                return
            stale = all(failed.stale_fence for failed in failures)
            retry = stale and attempt + 1 < GANG_START_ATTEMPTS and time.monotonic() < deadline
            next_pick: PickAnswer | None = None
            try:
                if retry:
                    log.info(
                        "gang %s: member rank %s on %s refused plan fence %s as stale; "
                        "picking again (attempt %d)",
                        entry.job_id,
                        failures[0].row.rank,
                        failures[0].row.node,
                        pick.fence,
                        attempt + 1,
                    )
                    next_pick = await self._pick_newer(request, pick.fence, deadline)
            finally:
                # the new pick's fence first: a member that refused the old one is under it
                fences = [pick.fence] if next_pick is None else [next_pick.fence, pick.fence]
                await self.stop_members(_members(entry), fences)
            if next_pick is None:
                raise self._start_failed(failures, pick.fence, attempt + 1, began)
            pick, attempt = next_pick, attempt + 1

    @staticmethod
    def _start_failed(
        failures: Sequence[MemberFailure], fence: str, attempts: int, began: float
    ) -> JobError:
        """The error of a gang start that failed: the first member that could not start for
        another reason than a stale fence, else the first that refused `fence` as stale."""
        other = [failed for failed in failures if not failed.stale_fence]
        if other:
            row = other[0].row
            why = f"could not start: {other[0].reason}"
        else:
            row = failures[0].row
            why = (
                f"refused plan fence {fence} as stale ({failures[0].reason}); gave up after "
                f"{attempts} start attempts in {time.monotonic() - began:.1f} s: the plan kept "
                "moving on"
            )
        return JobError(502, "gang_start_failed", f"member rank {row.rank} on {row.node} {why}")

    async def _pick_newer(self, request: JobRequest, refused: str, deadline: float) -> PickAnswer:
        """The coordinator's pick, asked again every REPICK_PAUSE_S while its fence is not
        newer than `refused` and `deadline` has not passed (then the last pick as it is)."""
        while True:
            pick = await self._ask_pick(request.nodes, request.role)
            if fence_is_newer(pick.fence, refused) or time.monotonic() >= deadline:
                return pick
            await asyncio.sleep(REPICK_PAUSE_S)

    async def _start_members(
        self, entry: JobEntry, request: JobRequest, pick: PickAnswer, attempt: int
    ) -> list[MemberFailure]:
        """Start attempt `attempt` of the gang under `pick`: member 0 on the first candidate
        port free on its host, then the others with that port. The members that could not
        start (the started ones keep running: the caller stops them); none once every member
        started and the gang's record says so."""
        rows = [
            GangMember(
                rank=rank,
                node=member.node_id,
                url=self._url_of(member.node_id),
                job_id=member_job_id(entry.job_id, rank, attempt),
                state=JobState.PENDING,
                exit_code=None,
                signal=None,
                reason=None,
                ended_at=None,
            )
            for rank, member in enumerate(pick.members)
        ]
        entry.gang = GangRecord(
            members=tuple(rows),
            fence=pick.fence,
            started_at=None,
            master_port=None,
            attempt=attempt,
        )
        await asyncio.to_thread(self._write_gang, entry)
        starts = MemberStarts(
            self._call, entry.job_id, self._runtime.node_id, request.spec(), pick, rows
        )
        master_port, failure = await starts.start_master(self._runtime.settings.master_port)
        failures = [] if failure is None else [failure]
        if failure is None:
            entry.gang = entry.gang.model_copy(update={"master_port": master_port})
            failures = await starts.start_rest(master_port)
        rows = starts.rows
        entry.gang = entry.gang.model_copy(update={"members": tuple(rows)})
        if failures:
            return failures
        started_at = time.time()
        entry.gang = entry.gang.model_copy(update={"started_at": started_at})
        entry.started = {"started_at": started_at, "pid": None}
        await asyncio.to_thread(self._write_gang, entry)
        return []

    async def stop_members(self, rows: Sequence[GangMember], picked: Sequence[str]) -> None:
        """SIGKILL every member of a start attempt that failed. A kill carries this node's plan
        fence, or each of the `picked` fences in turn when the member refuses it (this node
        may apply an older plan than the coordinator's, or a newer one than the member's);
        while a member refuses them all, they are tried again (this node's plan re-read) for
        up to FENCE_RETRY_S. A member that never started answers 404; one that could not be
        told to stop is logged."""

        async def stop_one(row: GangMember) -> None:
            url = f"{row.url}/v1/jobs/{row.job_id}/kill"
            body = {"signal": "SIGKILL", "grace_s": 0.0}
            deadline = time.monotonic() + FENCE_RETRY_S
            while True:
                plan = self._plan()
                own = plan.fence.to_header() if plan is not None else None
                status, answer = 0, None
                for fence in dict.fromkeys(f for f in (own, *picked) if f is not None):
                    try:
                        status, answer = await self._call("POST", url, body, {FENCE_HEADER: fence})
                    except JobError as exc:
                        status, answer = exc.status, {"reason": exc.reason}
                        break
                    if status in (200, 404):
                        return
                    if not self._fence_refusal(answer):
                        break
                if not self._fence_refusal(answer) or time.monotonic() >= deadline:
                    reason = answer.get("reason", answer) if isinstance(answer, dict) else answer
                    log.warning(
                        "gang member %s on %s may still run: its kill failed: HTTP %s: %s",
                        row.job_id,
                        row.node,
                        status,
                        reason,
                    )
                    return
                await asyncio.sleep(0.1)

        await asyncio.gather(*(stop_one(row) for row in rows))

    @staticmethod
    def _fence_refusal(answer: Any) -> bool:
        """Whether a member's error answer refuses the request's plan fence."""
        return isinstance(answer, dict) and answer.get("error") in FENCE_REFUSALS
