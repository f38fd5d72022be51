"""The decisions of gang jobs without sockets: who is picked in which order, how a gang ends,
which port it gets; a gang whose member answers nonsense ends `lost`, never `succeeded`; and a
start a member refuses as stale (the plan moved on after the pick) is picked and started again."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config import Role
from health import BreakerConfig, BreakerRegistry
from node.jobs import GangService, JobError, JobService, gang_master_port, parse_job_request
from node.jobs.gang import port_is_free
from node.jobs.records import GangMember, GangSpec, JobRecord, JobState, PickedNode, gang_env
from node.jobs.roster import (
    GANG_PORT_ATTEMPTS,
    GANG_START_ATTEMPTS,
    check_gang_id,
    gang_outcome,
    pick_members,
)
from node.plan import FENCE_HEADER, GroupSpec, RolePlan
from node.runtime import NodeRuntime
from tests.node.daemons import test_settings
from wal import WriteAheadLog


@dataclass(frozen=True)
class Member:
    node_id: str
    address: str
    port: int
    state: str = "alive"


PLAN = RolePlan(
    term=2,
    version=5,
    roles={"a": Role.INFERENCE, "b": Role.TRAINING, "c": Role.TRAINING, "d": Role.SELFPLAY},
    training_ranks=("c", "b"),
    group=GroupSpec("10.0.0.3", 29500, 2, "gloo"),
)
MEMBERS = [
    Member("a", "10.0.0.1", 1),
    Member("b", "10.0.0.2", 1),
    Member("c", "10.0.0.3", 1),
    Member("d", "10.0.0.4", 1),
    Member("e", "10.0.0.5", 1, "dead"),
]


def test_training_gangs_take_the_plan_ranks_first() -> None:
    picked = pick_members(MEMBERS, PLAN, 2, "training")
    assert [m.node_id for m in picked] == ["c", "b"]
    assert picked[0] == PickedNode(node_id="c", address="10.0.0.3", port=1)


def test_any_role_takes_alive_nodes_only_and_refuses_too_many() -> None:
    assert [m.node_id for m in pick_members(MEMBERS, PLAN, 4, "any")] == ["a", "b", "c", "d"]
    assert [m.node_id for m in pick_members(MEMBERS, PLAN, 1, "selfplay")] == ["d"]
    with pytest.raises(JobError) as refused:
        pick_members(MEMBERS, PLAN, 5, "any")
    assert refused.value.status == 503
    assert "4 alive nodes" in refused.value.reason


def member(rank: int, node: str, state: str, exit_code: int | None, ended_at: float) -> GangMember:
    return GangMember(
        rank=rank,
        node=node,
        url=f"http://{node}:8420",
        job_id=f"g.{rank}",
        state=JobState(state),
        exit_code=exit_code,
        signal=None,
        reason=None,
        ended_at=ended_at,
    )


def test_gang_outcome() -> None:
    members = [member(0, "a", "succeeded", 0, 1.0), member(1, "b", "succeeded", 0, 1.0)]
    assert gang_outcome(members, killed=False) == ("succeeded", 0, None)
    members[1] = member(1, "b", "failed", 4, 2.0)
    members[0] = member(0, "a", "killed", None, 3.0)
    state, code, reason = gang_outcome(members, killed=False)
    assert (state, code) == ("failed", 4)
    assert reason is not None
    assert reason.startswith("member rank 1 on b failed")
    assert gang_outcome(members, killed=True)[0] == "killed"


def test_gang_ports_are_stable_and_above_the_rendezvous_span() -> None:
    port = gang_master_port(29500, "g1")
    assert port == gang_master_port(29500, "g1") == gang_master_port(29500, "g1", 0)
    assert 31000 <= port < 32000
    later = [gang_master_port(29500, "g1", attempt) for attempt in range(1, 1001)]
    assert later[0] == (port + 1 if port < 31999 else 31000)
    assert sorted(later) == list(range(31000, 32000)), "the attempts walk the whole span"


def test_gang_env_gives_torchrun_its_arguments() -> None:
    gang = GangSpec(
        job_id="g", rank=1, nodes=3, master_addr="10.0.0.7", master_port=31234, owner=None
    )
    assert gang_env(gang) == {
        "SHOAL_JOB_ID": "g",
        "SHOAL_NODE_RANK": "1",
        "SHOAL_NODES_NUM": "3",
        "NODE_RANK": "1",
        "NNODES": "3",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "31234",
    }
    assert gang_env(None) == {}


def test_port_is_free_sees_a_listener_on_any_address() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = int(listener.getsockname()[1])
        assert not port_is_free(port)
    assert port_is_free(port)


async def test_a_member_answering_nonsense_makes_the_gang_lost(tmp_path: Path) -> None:
    async def nonsense(request: web.Request) -> web.Response:
        if request.path.endswith("/kill"):
            return web.json_response({"state": "killed"})
        if request.method == "POST":
            return web.json_response({"job_id": "g.0", "state": "running"}, status=201)
        return web.json_response({"state": "exploded"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", nonsense)
    async with TestServer(app, host="127.0.0.1") as member:
        settings = test_settings(tmp_path, "n")
        runtime = NodeRuntime(settings, "n", "127.0.0.1", "0", BreakerRegistry(BreakerConfig()))
        runtime.membership = FakeView([Member("m", "127.0.0.1", int(member.port or 0))])
        runtime.coordinator = "n"
        service = JobService("n", settings.jobs, tmp_path / "jobs", daemon_url=lambda: "x")
        gangs = GangService(runtime, service, lambda: PLAN, None)
        async with WriteAheadLog(tmp_path / "wal.db") as wal:
            await service.open(wal, gangs.recovery())
            await gangs.open()
            try:
                request = parse_job_request({"job_id": "g", "argv": ["true"], "nodes": 1})
                record, _ = await gangs.start_gang(request)
                assert record.state is JobState.RUNNING, record
                ended = await service.wait("g", 10)
                assert ended.state.value == "lost"
                assert "watching the members failed" in (ended.result or {})["reason"]
            finally:
                await gangs.close()
                await service.close()


def test_a_gang_id_leaves_room_for_every_member_job_id() -> None:
    """Member ids are `<gang>.<rank>[.a<attempt>]` and a job id is at most 128 characters:
    a gang id that leaves no room is refused when asked for, naming the room it has."""
    room = 128 - len(f".{15}.a{GANG_START_ATTEMPTS - 1}")
    check_gang_id("g" * room, 16)
    with pytest.raises(JobError, match=f"at most {room} characters") as refused:
        check_gang_id("g" * (room + 1), 16)
    assert (refused.value.status, refused.value.code) == (400, "invalid_job")
    check_gang_id("g" * (room + 1), 10)  # one digit fewer in the last rank


async def test_a_gang_whose_id_leaves_no_room_for_its_members_is_refused_unreserved(
    tmp_path: Path,
) -> None:
    settings = test_settings(tmp_path, "n")
    runtime = NodeRuntime(settings, "n", "127.0.0.1", "0", BreakerRegistry(BreakerConfig()))
    runtime.coordinator = "n"
    service = JobService("n", settings.jobs, tmp_path / "jobs", daemon_url=lambda: "x")
    gangs = GangService(runtime, service, lambda: PLAN, None)
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        await service.open(wal, gangs.recovery())
        await gangs.open()
        try:
            request = parse_job_request({"job_id": "g" * 128, "argv": ["true"], "nodes": 2})
            with pytest.raises(JobError, match="job_id of a gang of 2 nodes"):
                await gangs.start_gang(request)
            assert service.entries() == []
        finally:
            await gangs.close()
            await service.close()


async def test_a_gang_whose_member_0_finds_every_port_busy_fails_naming_them(
    tmp_path: Path,
) -> None:
    asked: list[int] = []

    async def busy(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body["gang"]["master_port"])
        error = {"error": "master_port_busy", "reason": "in use", "status": 409}
        return web.json_response(error, status=409)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", busy)
    async with TestServer(app, host="127.0.0.1") as member:
        settings = test_settings(tmp_path, "n")
        runtime = NodeRuntime(settings, "n", "127.0.0.1", "0", BreakerRegistry(BreakerConfig()))
        runtime.membership = FakeView([Member("m", "127.0.0.1", int(member.port or 0))])
        runtime.coordinator = "n"
        service = JobService("n", settings.jobs, tmp_path / "jobs", daemon_url=lambda: "x")
        gangs = GangService(runtime, service, lambda: PLAN, None)
        async with WriteAheadLog(tmp_path / "wal.db") as wal:
            await service.open(wal, gangs.recovery())
            await gangs.open()
            try:
                request = parse_job_request({"job_id": "g", "argv": ["true"], "nodes": 1})
                record, _ = await gangs.start_gang(request)
            finally:
                await gangs.close()
                await service.close()
    candidates = [gang_master_port(29500, "g", attempt) for attempt in range(GANG_PORT_ATTEMPTS)]
    assert asked == candidates
    assert record.state is JobState.FAILED, record
    ports = ", ".join(map(str, candidates))
    assert f"gang master ports {ports} are all in use there" in (record.reason or "")


class FakeView:
    def __init__(self, members: list[Member]) -> None:
        self._members = members

    def members(self) -> list[Any]:
        return list(self._members)

    def counts(self) -> dict[str, int]:
        return {"alive": len(self._members)}


class MovingPlan:
    """A stand-in coordinator `c` and member nodes `m0`, `m1` behind one server. The
    coordinator picks m0, m1 under the fence of `plans[0]`, the plan they all apply; the plan
    moves on (version + 1) as each of the first `moves` starts of rank 1 arrives, so each of
    those is refused 409 `stale_fence`. Starts and kills are accepted only under the current
    fence (as a member's start route and a `fenced` route check it); the long-polls of the
    gang's node are answered from the jobs started here."""

    def __init__(self, plans: list[RolePlan], moves: int) -> None:
        self.plans = plans
        self.moves = moves
        self.port = 0
        self.jobs: dict[str, JobState] = {}
        self.events: list[tuple[str, str, str | None]] = []

    def record(self, job_id: str) -> dict[str, Any]:
        state = self.jobs[job_id]
        now = time.time()
        return JobRecord(
            job_id=job_id, name="stand-in", node="m", argv=("true",), state=state,
            exit_code=None, signal="SIGKILL" if state is JobState.KILLED else None,
            reason=None, created_at=now, started_at=now,
            ended_at=now if state.ended else None, pid=None,
            log_bytes={"stdout": 0, "stderr": 0}, log_capped={"stdout": False, "stderr": False},
            max_log_bytes=1024, cwd=None, timeout_s=None, nodes=1, role="any",
        ).to_json()  # fmt: skip

    def refusal(self, fence: str | None) -> web.Response | None:
        current = self.plans[0].fence.to_header()
        if fence == current:
            return None
        reason = f"fence {fence} is not this node's {current}"
        error = {"error": "stale_fence", "reason": reason, "status": 409}
        return web.json_response(error, status=409)

    async def handle(self, request: web.Request) -> web.Response:
        parts = request.path.strip("/").split("/")  # v1 jobs [gang pick | id [kill | wait]]
        fence = request.headers.get(FENCE_HEADER)
        if parts == ["v1", "jobs", "gang", "pick"]:
            picked = [{"node_id": m, "address": "127.0.0.1", "port": self.port} for m in NODES]
            return web.json_response({"fence": self.plans[0].fence.to_header(), "members": picked})
        if request.method == "POST" and parts == ["v1", "jobs"]:
            return await self.start(request, fence)
        job_id = parts[2]
        if parts[3:] == ["kill"]:
            self.events.append(("kill", job_id, fence))
            refused = self.refusal(fence)
            if refused is not None:
                return refused
        if job_id not in self.jobs:
            error = {"error": "no_such_job", "reason": f"no job {job_id}", "status": 404}
            return web.json_response(error, status=404)
        if parts[3:] == ["kill"]:
            self.jobs[job_id] = JobState.KILLED
        elif parts[3:] == ["wait"]:
            await asyncio.sleep(0.05)
        return web.json_response(self.record(job_id))

    async def start(self, request: web.Request, fence: str | None) -> web.Response:
        body = await request.json()
        self.events.append(("start", body["job_id"], fence))
        if body["gang"]["rank"] == 1 and self.moves > 0:
            self.moves -= 1
            self.plans[0] = replace(self.plans[0], version=self.plans[0].version + 1)
        refused = self.refusal(fence)
        if refused is not None:
            return refused
        if body["job_id"] in self.jobs:  # a repeated start is answered as the job is
            return web.json_response(self.record(body["job_id"]))
        self.jobs[body["job_id"]] = JobState.RUNNING
        return web.json_response(self.record(body["job_id"]), status=201)


NODES = ("m0", "m1")


@dataclass
class MovingPlanStart:
    """What a gang start on a moving plan left: the gang's record as the start answered it,
    its members' jobs at that moment, and the stand-ins once the gang was killed."""

    record: JobRecord
    jobs_at_start: dict[str, JobState]
    stand_ins: MovingPlan


async def start_with_moving_plan(tmp_path: Path, moves: int, lagging: bool) -> MovingPlanStart:
    """Start gang `g` of 2 on node `n` over the stand-ins whose plan moves on `moves` times,
    then kill it. `lagging`: node `n` applies the first plan until the start answered (it
    did not see the plan move on), else the stand-ins' current plan."""
    plans = [PLAN]
    own = [PLAN]
    stand_ins = MovingPlan(plans, moves)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stand_ins.handle)
    async with TestServer(app, host="127.0.0.1") as server:
        stand_ins.port = port = int(server.port or 0)
        settings = test_settings(tmp_path, "n")
        runtime = NodeRuntime(settings, "n", "127.0.0.1", "0", BreakerRegistry(BreakerConfig()))
        runtime.membership = FakeView([Member(m, "127.0.0.1", port) for m in ("c", *NODES)])
        runtime.coordinator = "c"
        service = JobService("n", settings.jobs, tmp_path / "jobs", daemon_url=lambda: "x")
        gangs = GangService(runtime, service, lambda: own[0] if lagging else plans[0], None)
        async with WriteAheadLog(tmp_path / "wal.db") as wal:
            await service.open(wal, gangs.recovery())
            await gangs.open()
            try:
                request = parse_job_request({"job_id": "g", "argv": ["true"], "nodes": 2})
                record, created = await gangs.start_gang(request)
                assert created
                jobs_at_start = dict(stand_ins.jobs)
                own[0] = plans[0]
                if record.state is JobState.RUNNING:
                    await service.kill("g", "SIGKILL", 0.0)
                    ended = await service.wait("g", 10)
                    assert ended.state is JobState.KILLED, ended.result
            finally:
                await gangs.close()
                await service.close()
    return MovingPlanStart(record, jobs_at_start, stand_ins)


@pytest.mark.parametrize("lagging", [False, True], ids=["node_current", "node_lagging"])
async def test_a_member_refusing_a_stale_fence_once_makes_the_gang_pick_and_start_again(
    tmp_path: Path, lagging: bool
) -> None:
    """Rank 1 refuses the pick's fence as stale once: the gang is picked again under the new
    plan and started with member ids of its own; the first attempt's member 0 was stopped
    before (under the new fence when node `n` itself lags), and nothing is left running."""
    started = await start_with_moving_plan(tmp_path, moves=1, lagging=lagging)
    record = started.record
    assert record.state is JobState.RUNNING, record.reason
    assert record.gang is not None
    first, second = ["g.0", "g.1"], ["g.0.a1", "g.1.a1"]
    assert (record.gang.fence, record.gang.attempt) == ("2.6", 1)
    assert [m.job_id for m in record.gang.members] == second
    assert [m.state for m in record.gang.members] == [JobState.RUNNING] * 2
    assert started.jobs_at_start == {
        first[0]: JobState.KILLED,
        second[0]: JobState.RUNNING,
        second[1]: JobState.RUNNING,
    }, "the first attempt's member 0 was stopped, the second attempt's members run"
    starts = [(job, fence) for kind, job, fence in started.stand_ins.events if kind == "start"]
    assert starts == [
        (first[0], "2.5"),
        (first[1], "2.5"),
        (second[0], "2.6"),
        (second[1], "2.6"),
    ], "picked again under the plan that moved on"
    events = started.stand_ins.events
    killed_first = events.index(("kill", first[0], "2.6"))
    assert killed_first < events.index(("start", second[0], "2.6")), "stopped before the retry"
    assert set(started.stand_ins.jobs.values()) == {JobState.KILLED}, "nothing left running"


async def test_a_plan_that_keeps_moving_fails_the_gang_naming_the_member_and_fence(
    tmp_path: Path,
) -> None:
    started = await start_with_moving_plan(tmp_path, moves=GANG_START_ATTEMPTS, lagging=False)
    record = started.record
    assert record.state is JobState.FAILED, record
    last = f"2.{PLAN.version + GANG_START_ATTEMPTS - 1}"
    reason = record.reason or ""
    assert f"member rank 1 on m1 refused plan fence {last} as stale" in reason, reason
    assert f"gave up after {GANG_START_ATTEMPTS} start attempts" in reason, reason
    assert len(started.jobs_at_start) == GANG_START_ATTEMPTS, "one member 0 per attempt"
    assert set(started.jobs_at_start.values()) == {JobState.KILLED}, "every one was stopped"
