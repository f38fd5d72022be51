"""The work plane's POST routes check their bodies with the models the OpenAPI document shows:
a body the model refuses is 400 in the route's own error code, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from node.daemon import NodeDaemon
from tests.node.daemons import test_settings

REFUSED = (
    # (path, body, error code, the field the reason starts with)
    ("/v1/locks/l/acquire", {"holder": "h"}, "invalid_lock_request", "ttl_s"),
    (
        "/v1/locks/l/acquire",
        {"holder": "h", "ttl_s": 5, "tll_s": 5},
        "invalid_lock_request",
        "tll_s",
    ),
    (
        "/v1/locks/l/acquire",
        {"holder": "h", "ttl_s": 5, "wait_s": 31},
        "invalid_lock_request",
        "wait_s",
    ),
    ("/v1/locks/l/renew", {"holder": "h", "fence": [1]}, "invalid_lock_request", "fence"),
    ("/v1/lockstore/prepare", {"term": -1}, "invalid_lock_request", "term"),
    ("/v1/lockstore/accept", {"term": 1}, "invalid_lock_request", "table"),
    ("/v1/actors/a/ready", {"incarnation": 1, "address": "h:1"}, "invalid_actor_request", "job"),
    ("/v1/actors/a/dead", {"incarnation": "1"}, "invalid_actor_request", "incarnation"),
    ("/v1/actors/a/claim", {"get_if_exists": "yes"}, "invalid_actor_request", "get_if_exists"),
    ("/v1/runs", {"argv": []}, "invalid_run", "argv"),
    ("/v1/runs", {"argv": ["x"], "priority": 1}, "invalid_run", "priority"),
    ("/v1/runs/r/cancel", {"now": True}, "invalid_run", "now"),
    ("/v1/jobs/gang/pick", {"nodes": 0}, "invalid_pick", "nodes"),
    ("/v1/jobs/gang/pick", {"nodes": 2, "role": "painter"}, "invalid_pick", "role"),
    ("/v1/jobs/j/kill", {"grace_s": -1}, "invalid_job", "grace_s"),
)


async def _post(session: ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def test_each_route_refuses_what_its_model_refuses(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "a")) as daemon, ClientSession() as session:
        base = f"http://127.0.0.1:{daemon.port}"
        for path, body, code, field in REFUSED:
            status, answer = await _post(session, base + path, body)
            assert (status, answer["error"]) == (400, code), (path, body, answer)
            assert field in answer["reason"], (path, answer)
        # an action no model describes is no route: 404 before any body is read
        status, answer = await _post(session, f"{base}/v1/actors/a/sleep", {})
        assert (status, answer["error"]) == (404, "no_such_action")
