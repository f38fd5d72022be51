"""Data sync through real daemons: files and records move exactly once, on request; the record
cursor is saved, so a second pull (also after a restart) pulls nothing; a run that moved data
is a committed `sync_completed` WAL entry."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from typer.testing import CliRunner

from config import NodeSettings, load_settings
from node import NodeDaemon
from node.cli import app
from node.cli import sync as cli_sync
from tests.node.daemons import test_settings
from wal import SYNC_COMPLETED, EntryState, WalEntry


def _settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    return test_settings(tmp_path, name, sync_interval_s=0, **flags)


def _game(index: int, quality: float) -> dict[str, Any]:
    return {
        "game_id": f"g-{index}",
        "created_at": 1000.0 + index,
        "board_type": "hex8" if index % 2 else "sq8",
        "num_players": 2,
        "winner": index % 2,
        "moves": ["a1", "b2"],
        "quality": quality,
    }


async def test_files_and_records_move_to_a_peer_exactly_once(tmp_path: Path) -> None:
    source = NodeDaemon(_settings(tmp_path, "src"))
    await source.start()
    try:
        checkpoint = source.settings.category_path("models") / "run1" / "ckpt.pt"
        checkpoint.parent.mkdir(parents=True)
        checkpoint.write_bytes(os.urandom(300_000))
        async with ClientSession() as session:
            url = f"http://127.0.0.1:{source.port}/v1/records/games"
            games = [_game(i, i / 10) for i in range(10)]
            async with session.post(url, json=games) as response:
                assert (await response.json())["accepted"] == 10
        seed = (f"127.0.0.1:{source.port}",)
        async with NodeDaemon(_settings(tmp_path, "dst", seeds=seed)) as dest:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                async with (
                    ClientSession() as session,
                    session.get(f"http://127.0.0.1:{dest.port}/v1/sync/status") as response,
                ):
                    if (await response.json())["peers"] == ["src"]:
                        break
                await asyncio.sleep(0.05)
            runner = CliRunner()
            node = f"http://127.0.0.1:{dest.port}"
            result = await asyncio.to_thread(
                runner.invoke, app, ["sync", "models", "games", "--node", node, "--json"]
            )
            assert result.exit_code == 0, result.output
            summary = json.loads(result.output)
            assert summary["files"]["models"]["files_transferred"] == 1
            assert summary["records"]["games"]["inserted"] == 10
            copied = dest.settings.category_path("models") / "run1" / "ckpt.pt"
            assert copied.read_bytes() == checkpoint.read_bytes()
            again = await asyncio.to_thread(
                runner.invoke, app, ["sync", "--node", node, "--from", "src", "--json"]
            )
            assert again.exit_code == 0, again.output
            second = json.loads(again.output)
            assert second["files"]["models"]["files_transferred"] == 0
            assert second["records"]["games"]["inserted"] == 0
            assert second["records"]["games"]["pulled"] == 0  # from the saved cursor
            completed = await _sync_completed(dest)
            assert len(completed) == 1  # the second run moved nothing: no history line
            assert completed[0].state is EntryState.COMMITTED
            assert completed[0].payload["peers"] == ["src"]
            assert completed[0].payload["files"]["models"] == 1
            assert completed[0].payload["records"]["games"] == 10
            status = await asyncio.to_thread(
                runner.invoke, app, ["sync", "status", "--node", node, "--json"]
            )
            status_document = json.loads(status.output)
            assert status_document["last_run"]["peers"] == ["src"]
            assert status_document["running"] is False
            (checkpoint.parent / "ckpt2.pt").write_bytes(b"x" * 5000)
            settings = load_settings(env={}, flags={"port": dest.port}).settings
            deadline = time.monotonic() + 15  # the source re-lists its tree within seconds
            transferred = 0
            while not transferred and time.monotonic() < deadline:
                run = cli_sync._request(
                    settings, "POST", f"{node}/v1/sync/run", {"categories": ["models"]}
                )
                result_with_bar = await cli_sync._run_with_progress(settings, node, run)
                transferred = result_with_bar["files"]["models"]["files_transferred"]
            assert transferred == 1
            async with (
                ClientSession() as session,
                session.get(f"{node}/v1/sync/status") as response,
            ):
                progress = (await response.json())["progress"]
            assert progress == {
                "files_total": 1,
                "bytes_total": 5000,
                "files_done": 1,
                "bytes_done": 5000,
            }
            async with (
                ClientSession() as session,
                session.get(f"{node}/v1/records/games/status") as response,
            ):
                assert (await response.json())["count"] == 10
            bad = await asyncio.to_thread(runner.invoke, app, ["sync", "nope", "--node", node])
            assert bad.exit_code == 1
            assert "categories" in bad.output
        async with NodeDaemon(_settings(tmp_path, "dst", seeds=seed)) as restarted:
            await _until_peer(restarted, "src")
            assert restarted.sync_service is not None
            peers = restarted.sync_service.alive_peers()
            after = await restarted.sync_service.run_once(["games"], peers)
            assert after["records"]["games"] == {
                "pulled": 0,
                "inserted": 0,
                "duplicates": 0,
                "errors": [],
                "failed_nodes": {},
            }
    finally:
        await source.close()


async def _until_peer(daemon: NodeDaemon, peer: str) -> None:
    deadline = time.monotonic() + 10
    assert daemon.sync_service is not None
    while [p.node_id for p in daemon.sync_service.alive_peers()] != [peer]:
        assert time.monotonic() < deadline, f"{peer} never became an alive peer"
        await asyncio.sleep(0.05)


async def _sync_completed(daemon: NodeDaemon) -> list[WalEntry]:
    assert daemon.runtime is not None
    wal = daemon.runtime.wal
    assert wal is not None
    entries = [await wal.get(i) for i in range(1, (await wal.stats()).last_id + 1)]
    return [e for e in entries if e is not None and e.entry_type == SYNC_COMPLETED]


async def test_rsync_without_an_inventory_is_a_config_error(tmp_path: Path) -> None:
    import pytest

    from config import ConfigError

    settings = _settings(tmp_path, "r", sync_transports=("rsync", "http"))
    with pytest.raises(ConfigError, match="rsync needs an inventory"):
        await NodeDaemon(settings).start()
