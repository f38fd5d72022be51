"""Fan-out through real daemons on loopback: 1 origin and 4 pullers of a 64 MiB checkpoint,
every node under an upload cap, all pulling at once. Every copy verifies, the pullers get
pieces from each other, and the origin sends well under 4 copies."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from typer.testing import CliRunner

from node import NodeDaemon
from node.cli import app
from tests.node.daemons import test_settings

SIZE = 64 << 20
UPLOAD_CAP = 48e6
PULLERS = 4
LIVENESS_S = 120.0


async def _json(session: ClientSession, method: str, url: str, **kw: Any) -> Any:
    async with session.request(method, url, **kw) as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


def _digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


async def test_four_pullers_fetch_pieces_from_each_other(tmp_path: Path) -> None:
    flags = {"sync_interval_s": 0, "sync_upload_limit_bytes_s": UPLOAD_CAP}
    origin = NodeDaemon(test_settings(tmp_path, "origin", **flags))
    await origin.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(origin.close)
        checkpoint = origin.settings.category_path("models") / "run1" / "step-9.pt"
        checkpoint.parent.mkdir(parents=True)
        with checkpoint.open("wb") as file:
            for _ in range(SIZE >> 20):
                file.write(os.urandom(1 << 20))
        expected = _digest(checkpoint)
        seed = (f"127.0.0.1:{origin.port}",)
        pullers = [
            await stack.enter_async_context(
                NodeDaemon(test_settings(tmp_path, f"p{i}", seeds=seed, **flags))
            )
            for i in range(PULLERS)
        ]
        async with ClientSession() as session:
            deadline = time.monotonic() + 20
            for daemon in (origin, *pullers):
                url = f"http://127.0.0.1:{daemon.port}/v1/sync/status"
                while len((await _json(session, "GET", url))["peers"]) < PULLERS:
                    assert time.monotonic() < deadline, "the members never all met"
                    await asyncio.sleep(0.05)
            async with asyncio.timeout(LIVENESS_S):
                runs = await asyncio.gather(
                    *(
                        _json(
                            session,
                            "POST",
                            f"http://127.0.0.1:{daemon.port}/v1/sync/run",
                            json={"categories": ["models"], "from": "origin"},
                        )
                        for daemon in pullers
                    )
                )
            for run in runs:
                assert run["files"]["models"]["errors"] == []
                assert run["files"]["models"]["files_transferred"] == 1
            for daemon in pullers:
                copy = daemon.settings.category_path("models") / "run1" / "step-9.pt"
                assert _digest(copy) == expected
            status = await _json(session, "GET", f"http://127.0.0.1:{origin.port}/v1/sync/status")
            egress = status["fanout"]["models"]["served_bytes"]
            assert SIZE <= egress <= 2 * SIZE, f"origin sent {egress / SIZE:.2f} copies"
            from_peers = 0
            for daemon in pullers:
                base = f"http://127.0.0.1:{daemon.port}"
                counts = (await _json(session, "GET", f"{base}/v1/sync/status"))["fanout"]
                from_peers += counts["models"]["from_peers_bytes"]
            assert from_peers >= (PULLERS - 2) * SIZE
            async with session.get(f"http://127.0.0.1:{origin.port}/metrics") as answer:
                text = await answer.text()
            served = re.search(
                r'^shoal_sync_bytes_served_total\{category="models"\} (\S+)$', text, re.M
            )
            assert served is not None
            assert float(served.group(1)) == egress
        node = f"http://127.0.0.1:{origin.port}"
        shown = await asyncio.to_thread(CliRunner().invoke, app, ["sync", "status", "--node", node])
        assert shown.exit_code == 0, shown.output
        assert "served to peers" in shown.output
        assert f"{egress:,} B" in shown.output
