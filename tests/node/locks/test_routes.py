"""The lock and node routes' refusals on a real daemon: each answers LockError's JSON shape with
its own code (503 with Retry-After: 1), before any coordinator or voter is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from node.daemon import NodeDaemon
from node.locks.service import FORWARDED_HEADER
from tests.node.daemons import test_settings

ABSENT_VOTER = "zz-absent"
"""The only voter of the daemon under test: it is never up, so the daemon never coordinates."""


async def _post(
    session: ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], str | None]:
    async with session.post(url, json=body, headers=headers) as response:
        return response.status, await response.json(), response.headers.get("Retry-After")


async def test_lock_and_node_routes_refuse_with_their_own_codes(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "a", voters=[ABSENT_VOTER])
    async with NodeDaemon(settings) as daemon, ClientSession() as session:
        base = f"http://127.0.0.1:{daemon.port}"
        refused = [
            ("/v1/locks/" + "n" * 201 + "/acquire", {"holder": "h", "ttl_s": 5}, None),
            ("/v1/lockstore/prepare", {"term": 1}, None),
            ("/v1/lockstore/accept", {"term": 1, "table": {}}, None),
            ("/v1/locks/l/acquire", {"holder": "h", "ttl_s": 5}, None),
            ("/v1/locks/l/release", {"holder": "h"}, {FORWARDED_HEADER: "b"}),
            ("/v1/nodes/-a/drain", {}, None),
            ("/v1/nodes/a/drain", {"kill_after_s": -1}, None),
            ("/v1/nodes/ghost/drain", {}, None),
            ("/v1/nodes/a/undrain", {"now": True}, None),
            ("/v1/nodes/a/undrain", {}, None),
            ("/v1/nodes/ghost/leave", {}, None),
        ]
        answers = [await _post(session, base + path, body, h) for path, body, h in refused]
        async with session.get(f"{base}/v1/locks") as response:
            listing = (response.status, await response.json(), response.headers.get("Retry-After"))
    codes = [(status, answer["error"], retry) for status, answer, retry in [*answers, listing]]
    assert codes == [
        (400, "invalid_lock_name", None),
        (409, "not_a_voter", None),
        (409, "not_a_voter", None),
        (503, "not_coordinator", "1"),
        (503, "not_coordinator", "1"),
        (400, "invalid_node", None),
        (400, "invalid_drain", None),
        (404, "unknown_node", None),
        (400, "invalid_body", None),
        (503, "not_coordinator", "1"),
        (404, "unknown_node", None),
        (503, "not_coordinator", "1"),
    ]
    for status, answer, _ in [*answers, listing]:
        assert answer["status"] == status, answer
        assert answer["reason"], answer
    assert "no coordinator yet" in listing[1]["reason"]
    assert "kill_after_s" in answers[6][1]["reason"]
    assert "not in this node's view" in answers[10][1]["reason"]
