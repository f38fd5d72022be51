"""The decisions of gang jobs without sockets: who is picked in which order, how a gang ends,
which port it gets; and a gang whose member answers nonsense ends `lost`, never `succeeded`."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config import Role
from health import BreakerConfig, BreakerRegistry
from node.jobs import GangService, JobError, JobService, gang_master_port, parse_job_request
from node.jobs.gang import port_is_free
from node.jobs.records import GangMember, GangSpec, JobState, PickedNode, gang_env
from node.jobs.roster import GANG_PORT_ATTEMPTS, gang_outcome, pick_members
from node.plan import GroupSpec, RolePlan
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
