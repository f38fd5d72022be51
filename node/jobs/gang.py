"""Gang jobs (`"nodes": K`): the receiving node asks the coordinator to pick K alive nodes of
the role, starts the job on each (rank, MASTER_ADDR, MASTER_PORT, under the plan's fence), all
or nothing, then watches the members and ends the rest when one fails (`jobs.gang_failure`).

The gang's own record lives on the receiving node (`gang.json`: each member's node, job id,
state and exit code); each member is an ordinary job `<gang id>.<rank>` on its node
(`<gang id>.<rank>.a<N>` when the start was picked again because the plan moved on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from config.declare import Caller, route
from net import Identity, PeerClient, PeerRequestError, split_url
from node.errors import BodyError, JobError
from node.fence import fence_headers
from node.identity.peers import peer_tls
from node.jobs.drain import refuse_if_draining
from node.jobs.gang_attempts import GangAttempts
from node.jobs.gang_start import (
    PICK_ERRORS,
    PICK_PATH,
    PickBody,
    check_member_fence,
    coordinator_pick,
    member_url,
    port_is_free,
)
from node.jobs.records import (
    GangMember,
    JobRecord,
    JobRequest,
    JobState,
    PickAnswer,
    new_job_id,
    parse_job_request,
)
from node.jobs.roster import check_gang_id, gang_outcome
from node.jobs.service import JobService, ended_result
from node.jobs.store import JobEntry
from node.openapi import parse_body
from node.plan import (
    FENCE_HEADER,
    RolePlan,
)
from node.runtime import NodeRuntime
from node.security import request_sender
from wal import RecoveryHandler, WalEntry

log = logging.getLogger(__name__)

JOB_GANG = "job.gang"
WAIT_POLL_S = 30.0
MEMBER_UNREACHABLE_S = 60.0


class GangService:
    """Gang starts, the coordinator's pick, and the watchers of running gangs on this node."""

    def __init__(
        self,
        runtime: NodeRuntime,
        service: JobService,
        plan: Callable[[], RolePlan | None],
        secret: bytes | None,
    ) -> None:
        self.runtime = runtime
        self.service = service
        self._plan = plan
        self._secret = secret
        self._peers: PeerClient | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._killed: set[str] = set()
        self._attempts = GangAttempts(
            runtime,
            lambda entry: service.store.write_gang(entry),
            plan,
            self._call,
            self._ask_pick,
            self._url_of,
        )
        service.gang_kill = self.kill

    def recovery(self) -> dict[str, RecoveryHandler]:
        """WAL handlers: a gang start cut off by a crash ends the started members."""
        return {JOB_GANG: self._recover_gang}

    async def open(self) -> None:
        """Watch every gang of this node that still runs (after a restart too)."""
        self._open_session()
        for entry in self.service.entries():
            if entry.gang is not None and entry.gang.started_at and not entry.state.ended:
                self._watch(entry)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        if self._peers is not None:
            await self._peers.close()

    @property
    def _timeouts(self) -> Any:
        return self.runtime.settings.timeouts

    # HTTP

    @route(
        "POST",
        PICK_PATH,
        callers=[Caller.PEER],
        answers=((200, "fence and members"),),
        errors=PICK_ERRORS,
        body=PickBody,
        answer=PickAnswer,
    )
    async def _handle_pick(self, request: web.Request) -> web.Response:
        """Coordinator only: pick {"nodes": K, "role": R} alive nodes for a gang job; answers
        the plan fence and the members in rank order"""
        try:
            body = parse_body(PickBody, await request.read())
        except BodyError as exc:
            raise JobError(
                400, "invalid_pick", f'expected {{"nodes": K, "role": R}}: {exc}'
            ) from None
        return web.json_response(self.pick(body.nodes, body.role).to_json())

    def pick(self, nodes: int, role: str) -> PickAnswer:
        """The coordinator's choice of members; JobError 409 on any other node."""
        return coordinator_pick(self.runtime, self._plan(), nodes, role)

    async def start(self, body: object, headers: Mapping[str, str]) -> tuple[JobRecord, bool]:
        """The StartFn of the job routes: members (fenced), single jobs, and gangs."""
        request = parse_job_request(body)
        if not self._exists(request.job_id):
            refuse_if_draining(self._plan(), self.runtime.node_id)
        if request.gang is not None:
            self._check_fence(headers.get(FENCE_HEADER))
            if request.gang.rank == 0:
                self._check_master_port(request)
        if request.nodes == 1:
            entry, created = await self.service.start(request)
            return self.service.record(entry), created
        return await self.start_gang(request)

    def _exists(self, job_id: str | None) -> bool:
        """Whether job `job_id` exists here (a repeated start is answered as it is)."""
        if job_id is None:
            return False
        try:
            self.service.get(job_id)
        except JobError:
            return False
        return True

    def _check_fence(self, header: str | None) -> None:
        check_member_fence(self._plan(), header)

    def _check_master_port(self, request: JobRequest) -> None:
        """Member 0 hosts the gang's store on MASTER_PORT: refuse a new member 0 whose port is
        taken on this host (409 master_port_busy) so the gang's node tries the next one."""
        assert request.gang is not None
        if request.job_id is not None:
            with contextlib.suppress(JobError):
                self.service.get(request.job_id)
                return  # a repeated start of a member that runs (and may hold the port) already
        port = request.gang.master_port
        if not port_is_free(port):
            raise JobError(
                409,
                "master_port_busy",
                f"gang master port {port} is in use on {self.runtime.node_id}",
            )

    # starting a gang

    async def start_gang(self, request: JobRequest) -> tuple[JobRecord, bool]:
        """Pick, start every member, or none; answers the gang's record."""
        self.service.check_program(request)
        gang_id = request.job_id or new_job_id()
        check_gang_id(gang_id, request.nodes)
        request = request.with_id(gang_id)
        entry, created = await self.service.reserve(request)
        if not created:
            return self.service.record(entry), False
        wal = self.service.open_wal()
        audit = {"job_id": gang_id, "nodes": request.nodes, "sender": request_sender()}
        wal_id = await wal.append(JOB_GANG, audit)
        try:
            await self._attempts.run(entry, request)
        except JobError as exc:
            await self._fail(entry, exc.reason)
            await wal.rollback(wal_id, reason=exc.reason)
            return self.service.record(entry), True
        await wal.commit(wal_id)
        self._watch(entry)
        return self.service.record(entry), True

    async def _ask_pick(self, nodes: int, role: str) -> PickAnswer:
        coordinator = self.runtime.coordinator
        if coordinator is None:
            raise JobError(503, "no_coordinator", "there is no coordinator yet; retry shortly")
        if coordinator == self.runtime.node_id:
            return self.pick(nodes, role)
        url = self._url_of(coordinator)
        status, body = await self._call("POST", f"{url}{PICK_PATH}", {"nodes": nodes, "role": role})
        if status != 200:
            reason = body.get("reason", body) if isinstance(body, dict) else body
            raise JobError(
                status if status >= 400 else 502,
                "pick_failed",
                f"coordinator {coordinator}: {reason}",
            )
        try:
            return PickAnswer.model_validate(body)
        except ValueError as exc:
            raise JobError(
                502, "pick_failed", f"coordinator {coordinator} answered no pick: {exc}"
            ) from exc

    def _url_of(self, node_id: str) -> str:
        return member_url(self.runtime, node_id)

    async def _fail(self, entry: JobEntry, reason: str) -> None:
        log.warning("gang %s failed to start: %s", entry.job_id, reason)
        self.service.store.record_end(entry, ended_result(JobState.FAILED, reason))

    # watching and killing

    def _watch(self, entry: JobEntry) -> None:
        task = asyncio.create_task(self._watch_gang(entry), name=f"gang-{entry.job_id}")
        self._tasks[entry.job_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(entry.job_id, None))

    async def _watch_gang(self, entry: JobEntry) -> None:
        assert entry.gang is not None
        ranks = [member.rank for member in entry.gang.members]
        ending = False
        watchers = {asyncio.create_task(self._wait_member(entry, rank)) for rank in ranks}
        try:
            for done in asyncio.as_completed(list(watchers)):
                ended = await done
                await asyncio.to_thread(self.service.store.write_gang, entry)
                failed = ended.state is not JobState.SUCCEEDED
                if failed and not ending and self.runtime.settings.jobs.gang_failure == "kill":
                    ending = True
                    grace = self.runtime.settings.jobs.kill_grace_s
                    others = [m for m in self._members(entry) if m.rank != ended.rank]
                    await self._kill_members(others, "SIGTERM", grace)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A member's answer this node cannot read, or a full disk: the gang's end was not
            # observed, so it is lost (never succeeded); its members are told to stop.
            log.error("gang %s: watching its members failed: %s", entry.job_id, exc)
            await self._kill_members(self._members(entry), "SIGKILL", 0.0)
            why = f"exit status never observed: watching the members failed: {exc}"
            self.service.store.record_end(entry, ended_result(JobState.LOST, why))
            return
        finally:
            for task in watchers:
                task.cancel()
        state, exit_code, reason = gang_outcome(self._members(entry), entry.job_id in self._killed)
        result = ended_result(JobState(state), reason or "")
        result["exit_code"], result["reason"] = exit_code, reason
        result["started_at"] = entry.gang.started_at
        self.service.store.record_end(entry, result)
        log.info("gang %s ended %s: %s", entry.job_id, state, reason)

    @staticmethod
    def _members(entry: JobEntry) -> tuple[GangMember, ...]:
        return () if entry.gang is None else entry.gang.members

    @staticmethod
    def _set_member(entry: JobEntry, rank: int, **changes: Any) -> GangMember:
        """Member `rank` of the gang's record changed by `changes` (the record replaced)."""
        assert entry.gang is not None
        members = list(entry.gang.members)
        index = next(i for i, member in enumerate(members) if member.rank == rank)
        members[index] = GangMember.model_validate({**members[index].to_json(), **changes})
        entry.gang = entry.gang.model_copy(update={"members": tuple(members)})
        return members[index]

    async def _wait_member(self, entry: JobEntry, rank: int) -> GangMember:
        """Long-poll one member until it ends; a member unreachable for long is `lost`."""
        (row,) = [member for member in self._members(entry) if member.rank == rank]
        url = f"{row.url}/v1/jobs/{row.job_id}/wait?timeout_s={WAIT_POLL_S:g}"
        unreachable_since: float | None = None
        while True:
            try:
                status, answer = await self._call("GET", url, None, timeout_s=WAIT_POLL_S + 10)
            except JobError as exc:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > MEMBER_UNREACHABLE_S:
                    return self._set_member(
                        entry,
                        rank,
                        state=JobState.LOST.value,
                        reason=f"unreachable: {exc.reason}",
                        ended_at=time.time(),
                    )
                await asyncio.sleep(1.0)
                continue
            unreachable_since = None
            if status == 404:
                return self._set_member(
                    entry,
                    rank,
                    state=JobState.LOST.value,
                    reason="its node has no record of it",
                    ended_at=time.time(),
                )
            if status == 200 and isinstance(answer, dict):
                record = JobRecord.model_validate(answer)
                member = self._set_member(
                    entry,
                    rank,
                    state=record.state.value,
                    exit_code=record.exit_code,
                    signal=record.signal,
                    reason=record.reason,
                    ended_at=record.ended_at,
                )
                if record.state.ended:
                    return member
            else:
                await asyncio.sleep(1.0)

    async def kill(self, entry: JobEntry, signal_name: str, grace_s: float) -> None:
        """Kill every member of a gang (the gang ends `killed`)."""
        assert entry.gang is not None
        self._killed.add(entry.job_id)
        await self._kill_members(entry.gang.members, signal_name, grace_s)

    async def _kill_members(
        self, rows: Sequence[GangMember], signal_name: str, grace_s: float
    ) -> None:
        plan = self._plan()
        fence = fence_headers(plan.fence if plan is not None else None)

        async def kill_one(row: GangMember) -> None:
            url = f"{row.url}/v1/jobs/{row.job_id}/kill"
            body = {"signal": signal_name, "grace_s": grace_s}
            with contextlib.suppress(JobError):
                await self._call("POST", url, body, fence)

        await asyncio.gather(*(kill_one(row) for row in rows))

    async def _call(
        self,
        method: str,
        url: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, Any]:
        """One signed request to a peer: (status, JSON body); JobError(502) when unreachable."""
        if self._peers is None:
            raise JobError(503, "jobs_unavailable", "gang jobs are not running on this node")
        try:
            base, path_qs = split_url(url)
            response = await self._peers.request(
                method, base, path_qs, json=body, headers=headers, timeout_s=timeout_s,
                check=False,
            )  # fmt: skip
        except PeerRequestError as exc:
            raise JobError(502, "peer_unreachable", f"{method} {url}: {exc.reason}") from exc
        try:
            return response.status, response.json()
        except ValueError:
            return response.status, {"reason": response.body.decode("utf-8", "replace")[:200]}

    # recovery

    async def _recover_gang(self, wal_entry: WalEntry) -> None:
        """A gang start cut off by a crash: kill the members it may have started; it failed."""
        job_id = str(wal_entry.payload["job_id"])
        try:
            entry = self.service.get(job_id)
        except JobError:
            return
        if entry.state.ended or entry.gang is None:
            return
        self._open_session()
        await self._kill_members(entry.gang.members, "SIGKILL", 0.0)
        await self._fail(entry, "the node that started the gang restarted before every member ran")

    def _open_session(self) -> None:
        if self._peers is not None:
            return
        identity = Identity(self._secret, self.runtime.node_id, self.runtime.settings.cluster_name)
        self._peers = PeerClient(identity, timeouts=self._timeouts, tls=peer_tls(self.runtime))
