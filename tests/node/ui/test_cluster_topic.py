"""On a 3-node dev cluster with a cluster secret, the `members` topic of one node carries every
member's release and GPU list as that member's own signed /v1/status says them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from config import signing_middleware
from tests.node.test_dev_cluster import ROOT, _free_base_port

SECRET = "9f" * 32


def _config(root: Path) -> Path:
    secret = root / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    config = root / "shoal.yaml"
    config.write_text(
        "mdns: false\n"
        f"secret_file: {secret}\n"
        "sync_interval_s: 0\n"
        "timeouts: {probe_interval_s: 0.1, probe_timeout_s: 0.05, "
        "indirect_probe_timeout_s: 0.1, suspicion_s: 0.3}\n"
    )
    return config


async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


async def _members_until_complete(
    session: aiohttp.ClientSession, url: str, statuses: dict[str, Any]
) -> list[dict[str, Any]]:
    """The first `members` event in which every member shows its own release and GPUs."""
    async with session.get(url) as answer:
        assert answer.status == 200, await answer.text()
        async for line in answer.content:
            if not line.startswith(b"data: {"):
                continue
            members: list[dict[str, Any]] = json.loads(line[6:])["members"]
            shown = {
                row["node_id"]: (row["version"], row["gpu_list"], row["stale"]) for row in members
            }
            wanted = {
                node: (doc["version"], [gpu["index"] for gpu in doc["gpus"]], False)
                for node, doc in statuses.items()
            }
            got = {
                node: (version, None if gpus is None else [g["index"] for g in gpus], stale)
                for node, (version, gpus, stale) in shown.items()
            }
            if got == wanted:
                return members
    raise AssertionError("the event stream ended")


@pytest.mark.timeout(180)
async def test_the_members_topic_carries_every_members_release_and_gpus(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "SHOAL_CONFIG": str(_config(tmp_path))}
    base = _free_base_port(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "node", "dev-cluster", "--nodes", "3", "--base-port", str(base),
         "--data-dir", str(tmp_path / "dev")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    middleware = signing_middleware(SECRET.encode(), "cli-ui-test")
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        async with aiohttp.ClientSession(timeout=timeout, middlewares=(middleware,)) as session:
            urls = [f"http://127.0.0.1:{base + i}" for i in range(3)]
            async with asyncio.timeout(90):
                while True:
                    try:
                        peers = await _get(session, urls[0] + "/v1/peers")
                        if sum(m["state"] == "alive" for m in peers["members"]) == 3:
                            break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.2)
            statuses = {}
            for url in urls:
                doc = await _get(session, url + "/v1/status")
                statuses[doc["node_id"]] = doc
            assert len(statuses) == 3
            async with asyncio.timeout(60):
                members = await _members_until_complete(
                    session, urls[0] + "/v1/events?topics=members", statuses
                )
        others = [row for row in members if not row["is_self"]]
        assert len(others) == 2
        # the other two rows came from their own status, asked (signed) by node 1
        assert all(row["status_at"] is not None and row["status_error"] is None for row in others)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
