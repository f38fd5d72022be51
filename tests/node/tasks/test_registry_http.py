"""The actor routes over HTTP without an election: the coordinator answers, another node
refuses a request that was already forwarded once (no forwarding loop), 503 without one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from node.security import error_middleware
from node.tasks import ActorRoutes
from node.tasks.registry import FORWARDED_HEADER


def runtime(node_id: str, coordinator: str | None) -> Any:
    timeouts = SimpleNamespace(http_request_s=5.0)
    return SimpleNamespace(
        node_id=node_id,
        coordinator=coordinator,
        membership=None,
        settings=SimpleNamespace(timeouts=timeouts),
    )


async def serve(routes: ActorRoutes) -> TestServer:
    app = web.Application(middlewares=[error_middleware])
    app.add_routes(routes.routes())
    server = TestServer(app, port=0)
    await server.start_server()
    return server


async def test_coordinator_answers_and_a_forwarded_request_is_not_forwarded_again() -> None:
    coordinator = ActorRoutes(runtime("n1", "n1"), lambda: 4, None)
    follower = ActorRoutes(runtime("n2", "n3"), lambda: 4, None)
    lonely = ActorRoutes(runtime("n4", None), lambda: None, None)
    servers = [await serve(r) for r in (coordinator, follower, lonely)]
    try:
        async with aiohttp.ClientSession() as session:
            first = servers[0].make_url("/v1/actors/a/claim")
            async with session.post(first, json={"get_if_exists": True}) as response:
                body = await response.json()
                assert response.status == 200
                assert (body["created"], body["incarnation"], body["term"]) == (True, 1, 4)
            url = servers[1].make_url("/v1/actors/a/claim")
            headers = {FORWARDED_HEADER: "n9"}
            async with session.post(url, json={}, headers=headers) as response:
                body = await response.json()
                assert response.status == 409
                assert body["error"] == "not_coordinator"
                assert "n9" in body["reason"]
            async with session.post(url, json={}) as response:  # n3 is not in its view
                assert response.status == 503
                assert (await response.json())["error"] == "unknown_coordinator"
            async with session.get(servers[2].make_url("/v1/actors/a")) as response:
                assert response.status == 503
                assert (await response.json())["error"] == "no_coordinator"
    finally:
        for server in servers:
            await server.close()
        for routes in (coordinator, follower, lonely):
            await routes.close()
