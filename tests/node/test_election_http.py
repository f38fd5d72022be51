"""Election over real HTTP on 127.0.0.1: signed requests, the routes' refusals, the fence 409."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from config import Role, signing_middleware
from config.declare import Caller, route_defs
from config.declare import declared as declared_handlers
from node.election.elector import Elector
from node.election.messages import Heartbeat, PlanAnnounce, VoteRequest
from node.election.pull import PlanQuery
from node.election.roles import NodeCapabilities, RolePolicy
from node.election.routes import (
    HEARTBEAT_PATH,
    PLAN_PATH,
    VOTE_PATH,
    ElectionRoutes,
)
from node.election.seams import InMemoryDurableState
from node.election.state import ElectionConfig, ElectionRole
from node.election.transport import HttpElectionTransport
from node.fence import fence_refusal
from node.plan import FENCE_HEADER, PlanFence
from node.security import AUTH_POLICY, AuthPolicy, auth_middleware, error_middleware

SECRET = b"election-test-secret-0123456789abcdef"
FAST = {
    "heartbeat_interval_s": 0.03,
    "lease_s": 0.25,
    "election_min_s": 0.3,
    "election_max_s": 0.6,
}


def make_app(
    elector: Callable[[], Elector | None], extra: Sequence[web.RouteDef] = ()
) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app[AUTH_POLICY] = AuthPolicy(secret=SECRET)
    app.router.add_routes(route_defs(ElectionRoutes(elector)))
    app.router.add_routes(list(extra))
    return app


async def eventually(check: Callable[[], bool], timeout_s: float = 8.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


@pytest.fixture
async def signed() -> AsyncIterator[Callable[[str], ClientSession]]:
    sessions: list[ClientSession] = []

    def make(node_id: str) -> ClientSession:
        session = ClientSession(middlewares=(signing_middleware(SECRET, node_id),))
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        await session.close()


async def test_three_nodes_elect_over_signed_http() -> None:
    nodes = ("a", "b", "c")
    electors: dict[str, Elector] = {}
    addresses: dict[str, tuple[str, int]] = {}
    policy = RolePolicy(min_training=1, max_training=1)
    members = [NodeCapabilities(n, "127.0.0.1", 1, "L4", 24, Role.AUTO) for n in nodes]
    async with AsyncExitStack() as stack:
        for node in nodes:
            app = make_app(partial(electors.get, node))
            server = await stack.enter_async_context(TestServer(app, host="127.0.0.1"))
            addresses[node] = ("127.0.0.1", server.port or 0)
        for seed, node in enumerate(nodes):
            transport = await stack.enter_async_context(
                HttpElectionTransport(node, addresses.get, secret=SECRET, timeout_s=0.25)
            )
            elector = Elector(
                ElectionConfig(node, nodes, **FAST),
                transport,
                InMemoryDurableState(),
                capabilities=lambda: members,
                policy=policy,
                rng=random.Random(seed),
            )
            await stack.enter_async_context(elector)
            electors[node] = elector

        def settled() -> bool:
            leaders = [n for n, e in electors.items() if e.status.role is ElectionRole.COORDINATOR]
            return len(leaders) == 1 and all(
                e.plan is not None and e.plan == electors[leaders[0]].plan
                for e in electors.values()
            )

        await eventually(settled)
        leader = next(n for n, e in electors.items() if e.status.role is ElectionRole.COORDINATOR)
        host, port = addresses["b"]
        async with (
            ClientSession(middlewares=(signing_middleware(SECRET, "monitor"),)) as session,
            session.get(f"http://{host}:{port}{PLAN_PATH}") as response,
        ):
            assert response.status == 200
            announce = PlanAnnounce.from_dict(await response.json())
        assert announce.coordinator == leader
        assert announce.plan == electors[leader].plan


async def test_routes_refuse_unsigned_impersonating_malformed_and_not_running(
    signed: Callable[[str], ClientSession],
) -> None:
    running: dict[str, Elector] = {}
    app = make_app(lambda: running.get("b"))
    async with TestServer(app, host="127.0.0.1") as server:
        vote = server.make_url(VOTE_PATH)
        body = VoteRequest(1, "a").to_dict()
        async with signed("a").post(vote, json=body) as response:
            assert response.status == 503
        async with signed("a").get(server.make_url(PLAN_PATH)) as response:
            assert response.status == 503
        elector = Elector(
            ElectionConfig("b", ("a", "b", "c"), **FAST),
            HttpElectionTransport("b", lambda _: None, secret=SECRET, timeout_s=0.1),
            InMemoryDurableState(),
        )
        async with elector:
            running["b"] = elector
            async with ClientSession() as unsigned, unsigned.post(vote, json=body) as response:
                assert response.status == 401
            async with signed("c").post(vote, json=body) as response:
                assert response.status == 403
                assert "speaks for" in (await response.json())["reason"]
            async with signed("a").post(vote, data=b"{nope") as response:
                assert response.status == 400
            async with signed("a").post(vote, json={"term": "one", "candidate": "a"}) as resp:
                assert resp.status == 400
            async with signed("a").post(vote, json=body) as response:
                assert response.status == 200
                reply = await response.json()
                assert reply["type"] == "vote_reply"
                assert reply["reason"] == "lease"  # b just booted
            beat = Heartbeat(2, "a", 1).to_dict()
            async with signed("a").post(server.make_url(HEARTBEAT_PATH), json=beat) as response:
                assert response.status == 200
                ack = await response.json()
                assert ack["success"] is True
                assert ack["term"] == 2
            assert elector.status.coordinator == "a"


async def test_transport_answers_none_for_unknown_down_or_refusing_peers() -> None:
    async with HttpElectionTransport("a", lambda _: None, secret=SECRET, timeout_s=0.2) as t:
        assert await t.request_vote("b", VoteRequest(1, "a")) is None
    # a port nobody listens on
    async with HttpElectionTransport(
        "a", lambda _: ("127.0.0.1", 9), secret=SECRET, timeout_s=0.2
    ) as transport:
        assert await transport.send_heartbeat("b", Heartbeat(1, "a", 1)) is None
    # a server with another secret refuses the signature (401)
    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app[AUTH_POLICY] = AuthPolicy(secret=b"another-secret-entirely-0123456789")
    app.router.add_routes(route_defs(ElectionRoutes(lambda: None)))
    async with TestServer(app, host="127.0.0.1") as server:
        port = server.port or 0
        async with HttpElectionTransport(
            "a", lambda _: ("127.0.0.1", port), secret=SECRET, timeout_s=0.5
        ) as transport:
            assert await transport.request_vote("b", VoteRequest(1, "a")) is None


async def test_fence_refusal_in_a_role_dependent_handler(
    signed: Callable[[str], ClientSession],
) -> None:
    current = PlanFence(3, 2)

    async def train_step(request: web.Request) -> web.Response:
        refusal = fence_refusal(request, current)
        return refusal or web.json_response({"ok": True})

    app = make_app(lambda: None, [web.post("/v1/train/step", train_step)])
    async with TestServer(app, host="127.0.0.1") as server:
        url = server.make_url("/v1/train/step")
        answers: dict[str | None, tuple[int, Any]] = {}
        for header in ("3.2", "3.1", "4.1", None, "three"):
            headers = {} if header is None else {FENCE_HEADER: header}
            async with signed("a").post(url, json={}, headers=headers) as response:
                answers[header] = (response.status, await response.json())
        assert answers["3.2"] == (200, {"ok": True})
        status, body = answers["3.1"]
        assert status == 409
        assert body["fence"]["verdict"] == "stale"
        assert (body["error"], body["status"]) == ("stale_fence", 409)
        assert body["fence"]["current"] == [3, 2]
        assert answers["4.1"][0] == 409
        assert answers[None][1]["fence"]["verdict"] == "missing"
        assert answers["three"][0] == 400


def test_the_election_routes_are_declared_for_peers() -> None:
    declared = {
        (found.method, found.path): found
        for found, _ in declared_handlers(ElectionRoutes(lambda: None))
    }
    assert set(declared) == {
        ("POST", "/v1/election/vote"),
        ("POST", "/v1/election/heartbeat"),
        ("GET", "/v1/plan"),
    }
    assert declared["POST", "/v1/election/vote"].callers == {Caller.PEER}
    plan = declared["GET", "/v1/plan"]
    assert plan.query is PlanQuery
    assert {(refusal.status, refusal.code) for refusal in plan.errors} >= {(404, "plan_not_here")}


async def test_a_plan_is_fetched_by_fence_waiting_until_the_source_applies_it() -> None:
    nodes = ("a", "b", "c")
    electors: dict[str, Elector] = {}
    addresses: dict[str, tuple[str, int]] = {}
    policy = RolePolicy(min_training=1, max_training=1)
    members = [NodeCapabilities(n, "127.0.0.1", 1, "L4", 24, Role.AUTO) for n in nodes]
    async with AsyncExitStack() as stack:
        for node in nodes:
            server = await stack.enter_async_context(
                TestServer(make_app(partial(electors.get, node)), host="127.0.0.1")
            )
            addresses[node] = ("127.0.0.1", server.port or 0)
        transports = {}
        for seed, node in enumerate(nodes):
            transports[node] = await stack.enter_async_context(
                HttpElectionTransport(node, addresses.get, secret=SECRET, timeout_s=0.5)
            )
            elector = Elector(
                ElectionConfig(node, nodes, **FAST),
                transports[node],
                InMemoryDurableState(),
                capabilities=lambda: members,
                policy=policy,
                rng=random.Random(seed),
            )
            await stack.enter_async_context(elector)
            electors[node] = elector
        leaders: list[str] = []

        def settled() -> bool:
            leaders[:] = [
                n for n, e in electors.items() if e.status.role is ElectionRole.COORDINATOR
            ]
            fences = {None if e.plan is None else e.plan.fence for e in electors.values()}
            return len(leaders) == 1 and len(fences) == 1 and None not in fences

        await eventually(settled)
        source = next(n for n in nodes if n not in leaders)
        asker = next(n for n in nodes if n not in (source, leaders[0]))
        plan = electors[source].plan
        assert plan is not None
        fetch = transports[asker].fetch_plan
        assert await fetch(source, plan.fence, 0.0) == plan
        later = PlanFence(plan.term, plan.version + 1)
        assert await fetch(source, later, 0.1) is None  # 404: not applied there (yet)
        waiting = asyncio.create_task(fetch(source, later, 4.0))
        await asyncio.sleep(0.05)
        members[2] = NodeCapabilities("c", "127.0.0.1", 2, "L4", 80, Role.AUTO)  # c trains
        electors[leaders[0]].notify_membership_changed()
        fetched = await waiting
        assert fetched is not None
        assert fetched.fence == later
        assert fetched == electors[source].plan
        host, port = addresses[source]
        async with (
            ClientSession(middlewares=(signing_middleware(SECRET, asker),)) as session,
            session.get(f"http://{host}:{port}{PLAN_PATH}?fence=1.x") as response,
            session.get(f"http://{host}:{port}{PLAN_PATH}?wait_s=null") as no_number,
            session.get(f"http://{host}:{port}{PLAN_PATH}?wait_s=1&wait_s=1") as twice,
        ):
            assert response.status == 400
            assert no_number.status == 400  # checked even without a fence
            assert twice.status == 400
            assert "wait_s given twice" in (await twice.json())["reason"]
        fenced = f"http://{host}:{port}{PLAN_PATH}?fence={plan.fence.to_header()}"
        async with (
            ClientSession(middlewares=(signing_middleware(SECRET, "cli-op"),)) as session,
            session.get(fenced) as refused,
            session.get(f"http://{host}:{port}{PLAN_PATH}") as read,
        ):
            assert refused.status == 403  # an operator reads the plan, only nodes wait on one
            assert read.status == 200
