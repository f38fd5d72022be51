from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from config import load_settings, signed_headers, signing_middleware
from config.declare import Caller, route
from health import BreakerConfig, BreakerRegistry, NodeMetrics
from node import AuthPolicy, NodeRuntime, build_app
from node.component import Served
from node.routes import CoreRoutes

SECRET = b"0123456789abcdef0123456789abcdef"
TOKEN = b"metrics-token-0123456789"


@dataclass(frozen=True)
class FakeMember:
    node_id: str
    address: str
    port: int
    state: str
    incarnation: int
    last_seen_s: float
    meta: Mapping[str, Any] = field(default_factory=dict)
    is_self: bool = False


class FakeMembership:
    def __init__(self, members: Sequence[FakeMember]) -> None:
        self._members = list(members)

    def members(self) -> Sequence[FakeMember]:
        return self._members

    def counts(self) -> Mapping[str, int]:
        counts = {"alive": 0, "suspect": 0, "dead": 0, "left": 0}
        for member in self._members:
            counts[member.state] += 1
        return counts


def _runtime(tmp_path: Path) -> NodeRuntime:
    settings = load_settings(env={"SHOAL_DATA_DIR": str(tmp_path)}).settings
    breakers = BreakerRegistry(BreakerConfig(failure_threshold=1))
    metrics = NodeMetrics("node-a", "1.0")
    metrics.bind_breakers(breakers)
    return NodeRuntime(
        settings=settings,
        node_id="node-a",
        address="127.0.0.1",
        version="1.0",
        breakers=breakers,
        metrics=metrics,
        membership=FakeMembership(
            [
                FakeMember("node-a", "127.0.0.1", 8770, "alive", 1, 0.0, {"role": "auto"}, True),
                FakeMember("node-b", "127.0.0.2", 8770, "dead", 3, 9.5, {"version": "1.0"}),
            ]
        ),
    )


class Echo:
    @route("POST", "/v1/echo", callers=[Caller.PEER, Caller.OPERATOR])
    async def echo(self, request: web.Request) -> web.Response:
        """Echo a JSON body (test route)"""
        return web.json_response(await request.json())


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[TestServer]:
    runtime = _runtime(tmp_path)
    components = [CoreRoutes(), Served(Echo())]
    app = build_app(runtime, AuthPolicy(secret=SECRET, metrics_token=TOKEN), components)
    async with TestServer(app, host="127.0.0.1") as test_server:
        yield test_server


@pytest.fixture
async def signed() -> AsyncIterator[ClientSession]:
    async with ClientSession(middlewares=(signing_middleware(SECRET, "tester"),)) as session:
        yield session


async def test_health_needs_no_signature(server: TestServer) -> None:
    async with ClientSession() as session, session.get(server.make_url("/v1/health")) as resp:
        assert resp.status == 200
        assert (await resp.json())["status"] == "healthy"


async def test_status_has_every_contract_field(server: TestServer, signed: ClientSession) -> None:
    async with signed.get(server.make_url("/v1/status")) as resp:
        assert resp.status == 200
        status = await resp.json()
    for key in (
        "node_id", "cluster", "version", "address", "port", "started_at", "uptime_s", "role",
        "term", "coordinator", "plan_version", "members", "wal", "breakers", "health", "gpus",
        "config_hash",
    ):  # fmt: skip
        assert key in status, key
    assert status["members"] == {"alive": 1, "suspect": 0, "dead": 1, "left": 0}
    assert status["term"] is None
    assert status["breakers"] == {"open": [], "details": []}
    assert set(status["wal"]) == {"pending", "oldest_pending_age_s"}


async def test_status_lists_open_breakers(server: TestServer, signed: ClientSession) -> None:
    from node.routes import RUNTIME

    breaker = server.app[RUNTIME].breakers.breaker_for("gpu-b", "rsync")
    with pytest.raises(OSError, match="down"):
        async with breaker:
            raise OSError("down")
    async with signed.get(server.make_url("/v1/status")) as resp:
        status = await resp.json()
    assert status["breakers"]["open"] == ["gpu-b/rsync"]


async def test_peers_view(server: TestServer, signed: ClientSession) -> None:
    async with signed.get(server.make_url("/v1/peers")) as resp:
        members = (await resp.json())["members"]
    assert [m["node_id"] for m in members] == ["node-a", "node-b"]
    first = members[0]
    for key in ("node_id", "address", "port", "state", "incarnation", "last_seen_s", "role"):
        assert key in first
    assert members[1]["state"] == "dead"
    assert members[1]["version"] == "1.0"


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing signature headers"),
        ({"X-Shoal-Signature": "0" * 64}, "bad signature"),
    ],
)
async def test_unsigned_or_badly_signed_is_401(
    server: TestServer, headers: dict[str, str], reason: str
) -> None:
    base = signed_headers(SECRET, "x", "GET", "/v1/status") if headers else {}
    async with (
        ClientSession() as session,
        session.get(server.make_url("/v1/status"), headers={**base, **headers}) as resp,
    ):
        assert resp.status == 401
        assert reason in (await resp.json())["reason"]


async def test_replayed_and_stale_requests_are_401(server: TestServer) -> None:
    headers = signed_headers(SECRET, "x", "GET", "/v1/peers")
    async with ClientSession() as session:
        async with session.get(server.make_url("/v1/peers"), headers=headers) as resp:
            assert resp.status == 200
        async with session.get(server.make_url("/v1/peers"), headers=headers) as resp:
            assert resp.status == 401
            assert "nonce seen before" in (await resp.json())["reason"]
        stale = signed_headers(SECRET, "x", "GET", "/v1/peers", now=1_000_000)
        async with session.get(server.make_url("/v1/peers"), headers=stale) as resp:
            assert resp.status == 401
            assert "off" in (await resp.json())["reason"]


async def test_metrics_with_bearer_token_and_parsable(server: TestServer) -> None:
    async with ClientSession() as session:
        async with session.get(server.make_url("/metrics")) as resp:
            assert resp.status == 401
        bad = {"Authorization": "Bearer wrong"}
        async with session.get(server.make_url("/metrics"), headers=bad) as resp:
            assert resp.status == 401
        good = {"Authorization": f"Bearer {TOKEN.decode()}"}
        async with session.get(server.make_url("/metrics"), headers=good) as resp:
            assert resp.status == 200
            text = await resp.text()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert "shoal_build_info" in names


async def test_openapi_matches_the_routes(server: TestServer, signed: ClientSession) -> None:
    async with signed.get(server.make_url("/v1/openapi.json")) as resp:
        document = await resp.json()
    documented = {
        (method.upper(), path) for path, ops in document["paths"].items() for method in ops
    }
    routed = {
        (route.method, route.resource.canonical)
        for route in server.app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }

    def covers(template: str, path: str) -> bool:
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        return re.fullmatch(pattern, path) is not None

    # a templated route may be documented once per value it serves (one per record store)
    for method, path in documented:
        assert any(m == method and covers(t, path) for m, t in routed), (method, path)
    for method, template in routed:
        assert any(m == method and covers(template, p) for m, p in documented), template
    assert document["paths"]["/v1/health"]["get"]["security"] == [{}]  # no signature needed
    assert document["paths"]["/v1/openapi.json"]["get"]["security"] == [{}]


async def test_bad_input_gets_json_4xx_never_500(server: TestServer, signed: ClientSession) -> None:
    async with signed.get(server.make_url("/v1/nope")) as resp:
        assert resp.status == 404
        assert (await resp.json())["status"] == 404
    async with signed.delete(server.make_url("/v1/status")) as resp:
        assert resp.status == 405
        assert "GET" in resp.headers["Allow"]
        assert (await resp.json())["status"] == 405
    async with signed.post(server.make_url("/v1/echo"), data=b"{not json") as resp:
        assert resp.status == 400
        assert "malformed JSON" in (await resp.json())["reason"]
    big = json.dumps({"x": "a" * (65 * 1024 * 1024)}).encode()
    async with (
        ClientSession() as session,
        session.post(server.make_url("/v1/echo"), data=io.BytesIO(big)) as resp,
    ):
        assert resp.status == 401  # unsigned: refused before a byte of the body is read
    async with signed.post(server.make_url("/v1/echo"), data=io.BytesIO(big)) as resp:
        assert resp.status == 413
        assert (await resp.json())["status"] == 413


async def test_no_secret_serves_without_signature(tmp_path: Path) -> None:
    app = build_app(_runtime(tmp_path), AuthPolicy(secret=None))
    async with (
        TestServer(app, host="127.0.0.1") as test_server,
        ClientSession() as session,
        session.get(test_server.make_url("/v1/status")) as resp,
    ):
        assert resp.status == 200
