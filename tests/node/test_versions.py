"""Versions on the wire: X-Shoal-Version on every answer, `release` and `protocol` in
/v1/status, `protocol` per member in /v1/peers, and the release and protocol a daemon gossips."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from config import (
    HEADER_VERSION,
    OLDEST_PROTOCOL,
    PROTOCOL_META,
    PROTOCOL_VERSION,
    RELEASE_META,
    UNANNOUNCED_PROTOCOL,
    parse_version_header,
    protocol_gap,
    protocol_of,
    shoal_version,
    signing_middleware,
    version_header,
)
from config.declare import READ, route
from node import AuthPolicy, NodeDaemon, build_app
from node.component import Served
from node.routes import CoreRoutes
from tests.node.daemons import test_settings
from tests.node.test_api import SECRET, FakeMember, FakeMembership, _runtime


async def _boom(request: web.Request) -> web.Response:
    raise RuntimeError("broken on purpose")


async def _stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"data: 1\n\n")
    return response


class TestRoutes:
    __test__ = False

    @route("GET", "/v1/boom", callers=READ, summary="Fails (test route)")
    async def boom(self, request: web.Request) -> web.Response:
        return await _boom(request)

    @route("GET", "/v1/stream", callers=READ, summary="Streams (test route)")
    async def stream(self, request: web.Request) -> web.StreamResponse:
        return await _stream(request)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[TestServer]:
    runtime = _runtime(tmp_path)
    runtime.membership = FakeMembership(
        [
            FakeMember("node-a", "127.0.0.1", 8770, "alive", 1, 0.0,
                       {RELEASE_META: "1.0", PROTOCOL_META: PROTOCOL_VERSION}, True),
            FakeMember("node-b", "127.0.0.2", 8770, "alive", 3, 0.5, {RELEASE_META: "0.9"}),
            FakeMember("node-c", "127.0.0.3", 8770, "alive", 1, 0.5,
                       {RELEASE_META: "9.0", PROTOCOL_META: PROTOCOL_VERSION + 2}),
        ]
    )  # fmt: skip
    app = build_app(runtime, AuthPolicy(secret=SECRET), [CoreRoutes(), Served(TestRoutes())])
    test_server = TestServer(app, host="127.0.0.1")
    async with test_server:
        yield test_server


def test_the_header_value_reads_back() -> None:
    assert version_header("0.2.0", 7) == "0.2.0; protocol=7"
    assert parse_version_header(version_header("0.2.0")) == ("0.2.0", PROTOCOL_VERSION)
    assert parse_version_header(" 1.0+local ;protocol=3") == ("1.0+local", 3)
    for junk in (None, "", "0.2.0", "0.2.0; protocol=x", "0.2.0; proto=2", "; protocol=2"):
        assert parse_version_header(junk) is None, junk


def test_a_member_without_a_protocol_speaks_the_first() -> None:
    assert protocol_of({PROTOCOL_META: PROTOCOL_VERSION}) == PROTOCOL_VERSION
    for meta in ({}, {PROTOCOL_META: "2"}, {PROTOCOL_META: True}, {PROTOCOL_META: 0}):
        assert protocol_of(meta) == UNANNOUNCED_PROTOCOL == 1, meta


@pytest.mark.parametrize(
    ("path", "signed", "status"),
    [
        ("/v1/health", False, 200),
        ("/v1/status", True, 200),
        ("/v1/status", False, 401),
        ("/v1/nowhere", True, 404),
        ("/v1/boom", True, 500),
        ("/v1/stream", True, 200),
    ],
)
async def test_every_answer_names_the_release_and_protocol(
    server: TestServer, path: str, signed: bool, status: int
) -> None:
    middlewares = (signing_middleware(SECRET, "tester"),) if signed else ()
    async with (
        ClientSession(middlewares=middlewares) as session,
        session.get(server.make_url(path)) as response,
    ):
        assert response.status == status
        assert response.headers[HEADER_VERSION] == f"1.0; protocol={PROTOCOL_VERSION}"


async def test_status_and_peers_carry_release_and_protocol(server: TestServer) -> None:
    async with ClientSession(middlewares=(signing_middleware(SECRET, "tester"),)) as session:
        async with session.get(server.make_url("/v1/status")) as response:
            status = await response.json()
        async with session.get(server.make_url("/v1/peers")) as response:
            members = {m["node_id"]: m for m in (await response.json())["members"]}
    assert (status["release"], status["version"], status["protocol"]) == (
        "1.0",
        "1.0",
        PROTOCOL_VERSION,
    )
    assert (members["node-a"]["version"], members["node-a"]["protocol"]) == ("1.0", 2)
    assert (members["node-b"]["version"], members["node-b"]["protocol"]) == ("0.9", 1)
    assert members["node-c"]["protocol"] == PROTOCOL_VERSION + 2
    gaps = [note for note in status["notes"] if "protocol" in note]
    assert gaps == [protocol_gap("node-c", PROTOCOL_VERSION + 2)], status["notes"]


def test_a_member_more_than_one_protocol_away_is_named() -> None:
    assert OLDEST_PROTOCOL == PROTOCOL_VERSION - 1
    for near in (OLDEST_PROTOCOL, PROTOCOL_VERSION, PROTOCOL_VERSION + 1):
        assert protocol_gap("b", near) is None, near
    older = protocol_gap("b", OLDEST_PROTOCOL - 1)
    assert older is not None
    assert older.startswith(f"member b speaks protocol {OLDEST_PROTOCOL - 1}, older")
    assert "upgrade b" in older
    newer = protocol_gap("b", PROTOCOL_VERSION + 2)
    assert newer is not None
    assert "upgrade this node" in newer


async def test_a_daemon_gossips_its_release_and_protocol(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "a")) as first:
        seed = f"127.0.0.1:{first.port}"
        async with NodeDaemon(test_settings(tmp_path, "b", seeds=(seed,))) as second:
            url = f"http://127.0.0.1:{second.port}/v1/peers"
            deadline = time.monotonic() + 15
            async with ClientSession() as session:
                while True:
                    async with session.get(url) as response:
                        assert response.headers[HEADER_VERSION] == version_header(shoal_version())
                        members = {m["node_id"]: m for m in (await response.json())["members"]}
                    if members.get("a", {}).get("state") == "alive":
                        break
                    assert time.monotonic() < deadline, members
                    await asyncio.sleep(0.05)
    meta = members["a"]["meta"]
    assert (meta[RELEASE_META], meta[PROTOCOL_META]) == (shoal_version(), PROTOCOL_VERSION)
    assert members["a"]["protocol"] == PROTOCOL_VERSION
