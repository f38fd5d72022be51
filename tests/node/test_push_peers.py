"""A push (`POST /v1/sync/{category}/pull`) makes the node connect only to a member of its own
view, at the member's own address: a caller cannot point it at an arbitrary URL."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from config import NodeSettings
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings


def _settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    return test_settings(tmp_path, name, sync_interval_s=0, **flags)


async def test_a_push_names_a_member_at_its_own_url_or_is_refused(tmp_path: Path) -> None:
    contacted: list[str] = []

    async def decoy(request: web.Request) -> web.Response:
        contacted.append(request.path)
        return web.Response(status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", decoy)
    async with TestServer(app, host="127.0.0.1") as trap:
        trap_url = f"http://127.0.0.1:{trap.port}"
        async with NodeDaemon(_settings(tmp_path, "src")) as source:
            content = b"weights" * 1000
            model = source.settings.category_path("models") / "a.bin"
            model.write_bytes(content)
            seed = (f"127.0.0.1:{source.port}",)
            async with NodeDaemon(_settings(tmp_path, "dst", seeds=seed)) as dest:
                assert dest.sync_service is not None
                deadline = time.monotonic() + 20
                while [p.node_id for p in dest.sync_service.alive_peers()] != ["src"]:
                    assert time.monotonic() < deadline, "src never became an alive peer"
                    await asyncio.sleep(0.05)
                url = f"http://127.0.0.1:{dest.port}/v1/sync/models/pull"
                body = {"path": "a.bin", "hash": hashlib.sha256(content).hexdigest()}
                source_url = f"http://127.0.0.1:{source.port}"
                async with ClientSession() as session:
                    for peer in (
                        {"node_id": "stranger", "url": trap_url},
                        {"node_id": "src", "url": trap_url},
                    ):
                        async with session.post(url, json={**body, "peer": peer}) as response:
                            answer = await response.json()
                            assert response.status == 403, answer
                            assert answer["error"] == "forbidden"
                            assert "view" in answer["reason"]
                    assert contacted == []  # the node never connected to the caller's URL
                    peer = {"node_id": "src", "url": source_url}
                    async with session.post(url, json={**body, "peer": peer}) as response:
                        answer = await response.json()
                        assert response.status == 200, answer
                        assert answer["installed"] is True
                installed = dest.settings.category_path("models") / "a.bin"
                assert installed.read_bytes() == content
