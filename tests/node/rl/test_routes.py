"""The refusals of the rl routes that the plane's own tests do not reach: a malformed fence
header, the weights group's rendezvous without a valid run or a plan, and every malformed
consumed report or pending query of the rollouts backlog (each 400 naming its field, 503 while
the store is not open)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from node.plan import FENCE_HEADER
from node.rl.backlog import RolloutBacklog
from node.rl.routes import BacklogRoutes, WeightsRoutes
from node.rl.service import WeightsService


@pytest.fixture
async def base() -> AsyncIterator[str]:
    """A server of the weights routes (no plan yet) and of a backlog whose store is not open."""
    service = WeightsService("n", lambda: None, lambda _: None, registry=CollectorRegistry())
    backlog = RolloutBacklog(10, lambda: None, registry=CollectorRegistry())
    app = web.Application()
    app.add_routes([*WeightsRoutes(service).routes(), *BacklogRoutes(backlog).routes()])
    app.router.add_get("/v1/rendezvous", WeightsRoutes(service).rendezvous)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def _answer(
    session: ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, dict[str, Any], str | None]:
    async with session.request(method, url, **kwargs) as response:
        return response.status, await response.json(), response.headers.get("Retry-After")


async def test_a_malformed_fence_header_is_refused_by_name(base: str) -> None:
    async with ClientSession() as session:
        url = f"{base}/v1/weights/update"
        status, body, _ = await _answer(session, "POST", url, headers={FENCE_HEADER: "x"}, json={})
    assert (status, body["error"], body["param"]) == (400, "bad_request", FENCE_HEADER)


async def test_the_weights_rendezvous_needs_a_run_and_a_plan(base: str) -> None:
    async with ClientSession() as session:
        status, body, _ = await _answer(session, "GET", f"{base}/v1/rendezvous?run=.bad")
        assert (status, body["param"]) == (400, "run")
        status, body, _ = await _answer(session, "GET", f"{base}/v1/rendezvous?run=r1")
        assert (status, body["error"]) == (409, "conflict")
        assert "no role plan yet" in body["reason"]


@pytest.mark.parametrize(
    ("sent", "param"),
    [
        (b"{not json", "body"),
        (b"[1]", "body"),
        (b'{"run": "r", "ts": 1, "after": "a", "x": 1}', "x"),
        (b'{"run": "-r", "ts": 1, "after": "a"}', "run"),
        (b'{"run": "r", "ts": true, "after": "a"}', "ts"),
        (b'{"run": "r", "ts": "1", "after": "a"}', "ts"),
        (b'{"run": "r", "ts": 1e309, "after": "a"}', "ts"),
        (b'{"run": "r", "ts": -1.75e308, "after": "a"}', "ts"),
        (b'{"run": "r", "ts": 1, "after": 2}', "after"),
    ],
)
async def test_a_malformed_consumed_report_is_refused_by_field(
    base: str, sent: bytes, param: str
) -> None:
    async with ClientSession() as session:
        url = f"{base}/v1/rollouts/consumed"
        status, body, _ = await _answer(session, "POST", url, data=sent)
    assert (status, body["error"], body["param"]) == (400, "bad_request", param)


async def test_a_consumed_report_answers_the_backlog_without_a_store(base: str) -> None:
    async with ClientSession() as session:
        url = f"{base}/v1/rollouts/consumed"
        report = {"run": "r", "ts": 2.5, "after": "r-1"}
        status, body, _ = await _answer(session, "POST", url, json=report)
    assert status == 200
    assert body == {
        "run": "r",
        "pending": 0,
        "max_pending": 10,
        "consumed": {"ts": 2.5, "after": "r-1"},
    }


async def test_the_pending_query_is_checked_and_waits_for_the_store(base: str) -> None:
    async with ClientSession() as session:
        url = f"{base}/v1/rollouts/pending"
        status, body, _ = await _answer(session, "GET", f"{url}?run=r&extra=1")
        assert (status, body["param"]) == (400, "extra")
        status, body, _ = await _answer(session, "GET", f"{url}?run=.r")
        assert (status, body["param"]) == (400, "run")
        status, body, retry = await _answer(session, "GET", f"{url}?run=r")
        assert (status, body["error"], retry) == (503, "unavailable", "1")
