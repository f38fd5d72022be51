"""The dashboard's fan-out to the other members: their status (release, GPUs with health) and
weights in the rows, a member that does not answer stale without delaying the others, and no
request while no page reads the topic."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aiohttp import ClientSession, ClientTimeout, web
from aiohttp.test_utils import TestServer

from config import AuthError, NonceCache, verify_request
from health.errors import FetchError
from health.monitor.model import NodeStatusDoc, parse_status
from node.rl.offers import DigestRecord, WeightsStatus
from node.rl.routes import WeightsRoutes
from node.rl.service import RunWeights, WeightsService
from node.runtime import NodeRuntime
from node.security import error_middleware, json_error
from node.ui.events import EventHub
from node.ui.peers import Known, Peer, PeerClient, PeerFanout, ask_status, ask_weights
from node.ui.topics import ClusterPeers, UiSources, member_rows, rl_topic

INTERVAL_S = 0.05
SECRET = b"s" * 32


def status_doc(node_id: str, version: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"node_id": node_id, "version": version, "role": "inference", "health": "healthy",
            "gpus": gpus, "health_problems": []}  # fmt: skip


GPU_OK = {"index": 0, "name": "H100", "uuid": "GPU-0", "error": False, "util_pct": 12.0}
GPU_BAD = {"index": 1, "name": "H100", "uuid": "GPU-1", "error": True, "xid_errors": 2,
           "problems": ["Xid 79: fell off the bus"]}  # fmt: skip


@dataclass
class FakeMember:
    node_id: str
    state: str = "alive"
    address: str = "127.0.0.1"
    port: int = 9
    incarnation: int = 0
    last_seen_s: float = 0.5
    meta: dict[str, Any] = field(default_factory=lambda: {"version": "old", "gpu_count": 8})
    is_self: bool = False


@dataclass
class FakeView:
    items: list[FakeMember]

    def members(self) -> list[FakeMember]:
        return list(self.items)


@dataclass
class FakeRuntime:
    node_id: str
    membership: FakeView
    metrics: None = None


def sources_of(*members: FakeMember) -> UiSources:
    runtime = FakeRuntime("here", FakeView([FakeMember("here", is_self=True), *members]))
    return UiSources(cast(NodeRuntime, runtime), lambda: None)


def peers_of(sources: UiSources) -> list[Peer]:
    membership = cast(FakeRuntime, sources.runtime).membership
    return [Peer(m.node_id, m.address, m.port) for m in membership.items
            if m.state == "alive" and not m.is_self]  # fmt: skip


async def until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)
    assert check(), what


class FakeAsk:
    """Answers each member's status from `docs`; a member in `hang` never answers; counts asks
    per member."""

    def __init__(self, docs: dict[str, dict[str, Any]]) -> None:
        self.docs = docs
        self.hang: set[str] = set()
        self.fail: set[str] = set()
        self.asks: dict[str, int] = {}

    async def __call__(self, peer: Peer) -> NodeStatusDoc:
        self.asks[peer.node_id] = self.asks.get(peer.node_id, 0) + 1
        if peer.node_id in self.hang:
            await asyncio.Event().wait()
        if peer.node_id in self.fail:
            raise FetchError("connection refused")
        return parse_status(self.docs[peer.node_id])


async def test_a_members_release_and_gpu_health_appear_in_its_row() -> None:
    sources = sources_of(FakeMember("gpu-1"), FakeMember("gpu-2", state="dead"))
    ask = FakeAsk({"gpu-1": status_doc("gpu-1", "1.4.2", [GPU_OK, GPU_BAD])})
    fanout = PeerFanout(ask, interval_s=INTERVAL_S, timeout_s=5.0)
    fanout.latest(peers_of(sources))
    await until(lambda: "gpu-1" in fanout.known(), "gpu-1's status")
    rows = {row["node_id"]: row for row in member_rows(sources, fanout.latest(peers_of(sources)))}
    row = rows["gpu-1"]
    assert row["version"] == "1.4.2"  # from its own status, not the membership metadata
    assert row["role"] == "inference"
    assert row["health"] == "healthy"
    assert [(g["index"], g["healthy"]) for g in row["gpu_list"]] == [(0, True), (1, False)]
    assert row["gpu_list"][1]["problems"] == ["Xid 79: fell off the bus"]
    assert row["gpus"] == 2
    assert row["stale"] is False
    assert row["status_at"] is not None
    assert ask.asks == {"gpu-1": 1}  # a dead member is not asked
    assert rows["gpu-2"]["gpu_list"] is None
    assert rows["gpu-2"]["version"] == "old"
    await fanout.close()


async def test_an_unanswering_member_is_stale_and_does_not_delay_the_others() -> None:
    sources = sources_of(FakeMember("gpu-1"), FakeMember("gpu-2"))
    docs = {name: status_doc(name, "2.0", [GPU_OK]) for name in ("gpu-1", "gpu-2")}
    ask = FakeAsk(docs)
    fanout = PeerFanout(ask, interval_s=INTERVAL_S, timeout_s=0.5)
    fanout.latest(peers_of(sources))
    await until(lambda: len(fanout.known()) == 2, "both answered once")
    ask.hang.add("gpu-2")
    docs["gpu-1"] = status_doc("gpu-1", "2.1", [GPU_OK])
    await asyncio.sleep(INTERVAL_S)
    fanout.latest(peers_of(sources))  # returns at once: the asks run in the background

    def gpu1_current() -> bool:
        known = fanout.known()["gpu-1"]
        return known.value is not None and known.value.version == "2.1"

    await until(gpu1_current, "gpu-1's new status while gpu-2 hangs")
    rows = {row["node_id"]: row for row in member_rows(sources, fanout.known())}
    assert rows["gpu-1"]["stale"] is False
    assert rows["gpu-2"]["stale"] is False  # its ask is still within the timeout

    await until(lambda: fanout.known()["gpu-2"].stale, "gpu-2 stale", 5.0)
    rows = {row["node_id"]: row for row in member_rows(sources, fanout.known())}
    assert rows["gpu-2"]["stale"] is True
    assert rows["gpu-2"]["status_error"] == "no answer within 0.5 s"
    assert rows["gpu-2"]["version"] == "2.0"  # its last known status stays, marked stale

    ask.hang.clear()
    ask.fail.add("gpu-1")
    await asyncio.sleep(INTERVAL_S)
    fanout.latest(peers_of(sources))
    await until(lambda: fanout.known()["gpu-1"].stale, "gpu-1 stale")
    known = fanout.known()["gpu-1"]
    assert known.error == "connection refused"
    assert known.value is not None
    await fanout.close()


async def test_one_round_per_interval_and_one_ask_in_flight_per_member() -> None:
    ask = FakeAsk({"gpu-1": status_doc("gpu-1", "1", [])})
    ask.hang.add("gpu-1")
    fanout = PeerFanout(ask, interval_s=INTERVAL_S, timeout_s=60.0)
    peers = [Peer("gpu-1", "127.0.0.1", 9)]
    for _ in range(20):
        fanout.latest(peers)
    await asyncio.sleep(INTERVAL_S * 4)
    for _ in range(20):
        fanout.latest(peers)
    await asyncio.sleep(0)
    assert ask.asks == {"gpu-1": 1}  # still in flight: never a second request
    await fanout.close()


async def test_members_are_asked_only_while_a_page_reads_the_topic() -> None:
    sources = sources_of(FakeMember("gpu-1"))
    ask = FakeAsk({"gpu-1": status_doc("gpu-1", "3.0", [GPU_OK])})
    fanout = PeerFanout(ask, interval_s=INTERVAL_S, timeout_s=5.0)

    async def members() -> dict[str, Any]:
        return {"members": member_rows(sources, fanout.latest(peers_of(sources)))}

    hub = EventHub({"members": members}, lambda _: None, interval_s=INTERVAL_S)
    await hub.open()
    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/v1/events", hub.handle_events)
    async with TestServer(app, host="127.0.0.1") as server:
        await asyncio.sleep(INTERVAL_S * 5)
        assert fanout.asked == 0  # no page: no request
        url = server.make_url("/v1/events?topics=members")
        async with (
            ClientSession(timeout=ClientTimeout(total=20)) as session,
            session.get(url) as answer,
        ):
            async for line in answer.content:
                if line.startswith(b"data: ") and b"3.0" in line:
                    break  # the page got gpu-1's release from its own status
        await until(lambda: hub.streams == 0, "the page gone")
        asked = fanout.asked
        await asyncio.sleep(INTERVAL_S * 5)
        assert fanout.asked == asked  # the page closed: no more requests
    await hub.close()
    await fanout.close()


@pytest.fixture
async def peer_server() -> AsyncIterator[tuple[Peer, list[str]]]:
    """A member of a release without /v1/weights/runs that checks the signature of every
    request and knows run `r1` only."""
    senders: list[str] = []
    nonces = NonceCache()

    async def check(request: web.Request) -> None:
        try:
            senders.append(verify_request(SECRET, request.headers, "GET", request.path_qs, b"",
                                          nonces))  # fmt: skip
        except AuthError as exc:
            raise web.HTTPUnauthorized(reason=str(exc)) from exc

    async def status(request: web.Request) -> web.Response:
        await check(request)
        return web.json_response(status_doc("peer", "9.9", [GPU_BAD]))

    async def weights(request: web.Request) -> web.Response:
        await check(request)
        if request.query.get("run") != "r1":
            return json_error(404, "no weights", code="no_weights")
        return web.json_response({"run": "r1", "version": 7, "applied_at": 1.0, "source": "file"})

    async def sleepy(request: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("never answers")

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/weights/status", weights)
    app.router.add_get("/v1/sleepy", sleepy)
    async with TestServer(app, host="127.0.0.1") as server:
        assert server.port is not None
        yield Peer("peer", "127.0.0.1", server.port), senders


async def test_the_client_signs_as_a_peer_and_reads_status_and_weights(
    peer_server: tuple[Peer, list[str]],
) -> None:
    peer, senders = peer_server
    client = PeerClient(SECRET, "here", "test-cluster")
    try:
        status = await ask_status(client, peer)
        assert status.version == "9.9"
        assert status.gpus[0].error is True
        assert await ask_weights(client, peer, ["r1", "r2"]) == {
            "r1": {"version": 7, "applied_at": 1.0, "source": "file"},
            "r2": None,
        }
        assert senders == ["here", "here", "here"]  # every request signed by this node
    finally:
        await client.close()


async def test_an_unsigned_client_is_refused_and_a_closed_port_is_a_fetch_error(
    peer_server: tuple[Peer, list[str]],
) -> None:
    peer, _ = peer_server
    client = PeerClient(None, "here", None)
    try:
        with pytest.raises(FetchError, match=r"^401"):
            await ask_status(client, peer)
        with pytest.raises(FetchError):
            await client.get_json(Peer("gone", "127.0.0.1", 1), "/v1/status")
    finally:
        await client.close()


async def test_a_fanout_over_http_marks_a_sleeping_member_stale(
    peer_server: tuple[Peer, list[str]],
) -> None:
    peer, _ = peer_server
    client = PeerClient(SECRET, "here", None)

    async def ask(target: Peer) -> Any:
        path = "/v1/sleepy" if target.node_id == "sleepy" else "/v1/status"
        return json.dumps(await client.get_json(peer, path))

    fanout: PeerFanout[Any] = PeerFanout(ask, interval_s=INTERVAL_S, timeout_s=0.3)
    try:
        fanout.latest([peer, Peer("sleepy", peer.address, peer.port)])
        await until(lambda: len(fanout.known()) == 2, "both known")
        known: dict[str, Known[Any]] = fanout.known()
        assert not known["peer"].stale
        assert "9.9" in str(known["peer"].value)
        assert known["sleepy"].stale
        assert known["sleepy"].value is None
    finally:
        await fanout.close()
        await client.close()


@dataclass
class FakeWeights:
    states: dict[str, RunWeights]

    def runs(self) -> dict[str, RunWeights]:
        return dict(self.states)


@dataclass
class FakePeers:
    """The parts of ClusterPeers rl_topic uses, over a fake ask."""

    weights: PeerFanout[dict[str, dict[str, Any] | None]]
    alive: list[Peer]

    def alive_peers(self) -> list[Peer]:
        return list(self.alive)

    def member_ids(self) -> list[str]:
        return [peer.node_id for peer in self.alive]


async def test_the_rl_topic_shows_each_nodes_weights_version_per_run() -> None:
    applied = WeightsStatus(
        run="r1",
        version=3,
        digest=DigestRecord(algo="sha256", value="ab" * 32),
        applied_at=5.0,
        source="file",
        bytes=1,
    )
    runtime = FakeRuntime("here", FakeView([FakeMember("here", is_self=True)]))
    runtime_any = cast(Any, runtime)
    runtime_any.metrics = None
    sources = UiSources(
        cast(NodeRuntime, runtime),
        lambda: None,
        weights=cast(WeightsService, FakeWeights({"r1": RunWeights(status=applied)})),
    )
    asked_runs: list[list[str]] = []

    async def ask(peer: Peer) -> dict[str, dict[str, Any] | None]:
        asked_runs.append(["r1"])
        return {"r1": {"version": 2, "applied_at": 4.0, "source": "broadcast"}}

    peers = FakePeers(
        PeerFanout(ask, interval_s=INTERVAL_S, timeout_s=5.0), [Peer("gpu-1", "127.0.0.1", 9)]
    )
    await rl_topic(sources, cast(ClusterPeers, peers))
    await until(lambda: "gpu-1" in peers.weights.known(), "gpu-1's weights")
    topic = await rl_topic(sources, cast(ClusterPeers, peers))
    assert topic["nodes"]["here"]["runs"] == {
        "r1": {"version": 3, "applied_at": 5.0, "source": "file"}
    }
    assert topic["nodes"]["gpu-1"]["runs"]["r1"]["version"] == 2
    assert topic["nodes"]["gpu-1"]["stale"] is False
    await peers.weights.close()


def _applied(run: str, version: int) -> WeightsStatus:
    return WeightsStatus(
        run=run,
        version=version,
        digest=DigestRecord(algo="sha256", value="cd" * 32),
        applied_at=float(version),
        source="broadcast",
        bytes=8,
    )


@asynccontextmanager
async def _weights_member(
    node_id: str, asks: list[str]
) -> AsyncIterator[tuple[Peer, WeightsService]]:
    """A member serving the real weights routes; `asks` gets its node id per request."""

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        asks.append(f"{node_id} {request.path_qs}")
        return await handler(request)

    service = WeightsService(node_id, lambda: None, lambda _: None)
    app = web.Application(middlewares=[error_middleware, count])
    app.add_routes(WeightsRoutes(service).routes())
    async with TestServer(app, host="127.0.0.1") as server:
        assert server.port is not None
        yield Peer(node_id, "127.0.0.1", server.port), service


async def test_the_rl_topic_lists_the_runs_every_alive_member_knows() -> None:
    """Runs known on different members all show, each member asked once per round (one GET
    /v1/weights/runs), whatever the runs this node knows."""
    asks: list[str] = []
    runtime = FakeRuntime("here", FakeView([FakeMember("here", is_self=True)]))
    cast(Any, runtime).metrics = None
    sources = UiSources(
        cast(NodeRuntime, runtime),
        lambda: None,
        weights=cast(WeightsService, FakeWeights({"r0": RunWeights(status=_applied("r0", 1))})),
    )
    client = PeerClient(None, "here", None)
    async with (
        _weights_member("gpu-1", asks) as (one, one_weights),
        _weights_member("gpu-2", asks) as (two, two_weights),
    ):
        one_weights.state("r1").status = _applied("r1", 4)
        two_weights.state("r2").status = _applied("r2", 6)
        two_weights.state("r3")  # known there (an offer came), nothing applied yet
        peers = FakePeers(
            PeerFanout(
                lambda peer: ask_weights(client, peer, ["r0"]), interval_s=60.0, timeout_s=5.0
            ),
            [one, two],
        )
        try:
            await rl_topic(sources, cast(ClusterPeers, peers))
            await until(lambda: len(peers.weights.known()) == 2, "both members' runs")
            topic = await rl_topic(sources, cast(ClusterPeers, peers))
        finally:
            await peers.weights.close()
            await client.close()
    assert topic["cluster_runs"] == ["r0", "r1", "r2", "r3"]
    assert sorted(topic["runs"]) == ["r0"]  # this node's own table
    nodes = topic["nodes"]
    assert {run: (a or {}).get("version") for run, a in nodes["here"]["runs"].items()} == {
        "r0": 1,
        "r1": None,
        "r2": None,
        "r3": None,
    }
    assert nodes["gpu-1"]["runs"] == {
        "r0": None,
        "r1": {"version": 4, "applied_at": 4.0, "source": "broadcast"},
        "r2": None,
        "r3": None,
    }
    assert nodes["gpu-2"]["runs"]["r2"] == {"version": 6, "applied_at": 6.0, "source": "broadcast"}
    assert nodes["gpu-2"]["runs"]["r3"] is None
    assert not nodes["gpu-1"]["stale"]
    assert not nodes["gpu-2"]["stale"]
    assert sorted(asks) == ["gpu-1 /v1/weights/runs", "gpu-2 /v1/weights/runs"]
