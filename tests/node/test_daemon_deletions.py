"""Deletion policies through two real daemons and `shoal sync --from`: with the defaults a
deleted config file is deleted on the peer (configs propagate), a deleted checkpoint is not
(models keep); `shoal sync status` shows each category's policy and its tombstones."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from typer.testing import CliRunner

from node import NodeDaemon
from node.cli import app
from node.cli.common import console
from node.cli.sync import _print_run
from tests.node.daemons import test_settings


async def _wait_for_peer(port: int, peer: str) -> None:
    deadline = time.monotonic() + 10
    async with ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(f"http://127.0.0.1:{port}/v1/sync/status") as response:
                if (await response.json())["peers"] == [peer]:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{peer} never became a peer of the node on port {port}")


async def _cli(*args: str) -> dict[str, Any]:
    result = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    answer: dict[str, Any] = json.loads(result.output)
    return answer


async def test_configs_deletions_propagate_and_models_are_kept(tmp_path: Path) -> None:
    source = NodeDaemon(test_settings(tmp_path, "src", sync_interval_s=0))
    await source.start()
    try:
        config = source.settings.category_path("configs") / "train.yaml"
        checkpoint = source.settings.category_path("models") / "ckpt.pt"
        for path, data in ((config, b"lr: 1"), (checkpoint, b"weights")):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        seed = (f"127.0.0.1:{source.port}",)
        settings = test_settings(tmp_path, "dst", sync_interval_s=0, seeds=seed)
        async with NodeDaemon(settings) as dest:
            await _wait_for_peer(dest.port, "src")
            node = f"http://127.0.0.1:{dest.port}"
            first = await _cli("sync", "models", "configs", "--node", node, "--from", "src")
            assert first["files"]["configs"]["files_transferred"] == 1
            assert first["files"]["models"]["files_transferred"] == 1
            config.unlink()
            checkpoint.unlink()
            deleted = {"configs": 0, "models": 0}
            copy = dest.settings.category_path("configs") / "train.yaml"
            deadline = time.monotonic() + 10
            while copy.exists() and time.monotonic() < deadline:
                again = await _cli("sync", "models", "configs", "--node", node, "--from", "src")
                for category in deleted:
                    deleted[category] += again["files"][category]["deleted"]
                await asyncio.sleep(0.1)
            assert deleted == {"configs": 1, "models": 0}
            assert not copy.exists()
            assert (dest.settings.category_path("models") / "ckpt.pt").read_bytes() == b"weights"
            status = await _cli("sync", "status", "--node", node)
            assert status["deletions"]["configs"] == {"policy": "propagate", "tombstones": 1}
            assert status["deletions"]["models"] == {"policy": "keep", "tombstones": 0}
            assert status["last_run"]["files"]["configs"]["stale_beyond_tombstone_ttl"] is False
    finally:
        await source.close()


async def test_a_deletion_is_seen_by_the_very_next_sync(tmp_path: Path) -> None:
    """`rm` then `shoal sync configs --from src` at once deletes the copy: the source notices
    the deletion when it serves its next manifest, although it listed the category moments ago
    (the listing it would reuse is younger than listing_fresh_s)."""
    source = NodeDaemon(test_settings(tmp_path, "src", sync_interval_s=0))
    await source.start()
    try:
        config = source.settings.category_path("configs") / "train.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_bytes(b"lr: 1")
        seed = (f"127.0.0.1:{source.port}",)
        settings = test_settings(tmp_path, "dst", sync_interval_s=0, seeds=seed)
        async with NodeDaemon(settings) as dest:
            await _wait_for_peer(dest.port, "src")
            node = f"http://127.0.0.1:{dest.port}"
            first = await _cli("sync", "configs", "--node", node, "--from", "src")
            assert first["files"]["configs"]["files_transferred"] == 1
            manifest = f"http://127.0.0.1:{source.port}/v1/sync/configs/manifest"
            async with ClientSession() as session, session.get(manifest) as response:
                assert [e["path"] for e in (await response.json())["entries"]] == ["train.yaml"]
            config.unlink()  # right after the source listed it, then sync at once
            again = await _cli("sync", "configs", "--node", node, "--from", "src")
            assert again["files"]["configs"]["deleted"] == 1
            assert not (dest.settings.category_path("configs") / "train.yaml").exists()
    finally:
        await source.close()


def test_the_sync_table_says_when_a_node_was_away_too_long() -> None:
    stats = {
        "files_transferred": 0,
        "bytes_transferred": 0,
        "errors": [],
        "deleted": 2,
        "stale_beyond_tombstone_ttl": True,
        "resurrected": 3,
    }
    with console.capture() as captured:
        _print_run({"peers": ["a"], "files": {"configs": stats}, "duration_seconds": 0.5})
    text = captured.get()
    assert "2 deleted" in text
    assert "stale_beyond_tombstone_ttl" in text
    assert "configs (3 files no peer has)" in text
    with console.capture() as quiet:
        _print_run(
            {
                "peers": ["a"],
                "files": {"configs": {**stats, "deleted": 0, "stale_beyond_tombstone_ttl": False}},
            }
        )
    assert "stale" not in quiet.get()
    assert "deleted" not in quiet.get()
