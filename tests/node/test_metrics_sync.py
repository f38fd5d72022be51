"""Sync and record series: ingested, duplicates and pulled per store; files and bytes per
category and peer; transfer failures per category and reason."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from prometheus_client.parser import text_string_to_metric_families

from node.daemon import NodeDaemon
from node.metrics import FAILURE_REASONS, failure_reason
from tests.node.daemons import test_settings


async def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with (
        ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _game(index: int) -> dict[str, Any]:
    return {
        "game_id": f"g-{index}",
        "created_at": 1000.0 + index,
        "board_type": "hex8",
        "num_players": 2,
        "winner": 1,
        "moves": ["a1"],
    }


async def test_records_and_files_are_counted_per_store_category_and_peer(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "src", sync_interval_s=0)) as source:
        model = source.settings.category_path("models") / "m.bin"
        model.write_bytes(os.urandom(50_000))
        url = f"http://127.0.0.1:{source.port}/v1/records/games"
        async with ClientSession() as session:
            for batch in ([_game(i) for i in range(5)], [_game(3), _game(4), _game(5)]):
                async with session.post(url, json=batch) as response:
                    assert response.status == 200
        seen = await _samples(source.port)
        assert seen["shoal_records_ingested_total", (("store", "games"),)] == 6
        assert seen["shoal_records_duplicates_total", (("store", "games"),)] == 2
        seed = (f"127.0.0.1:{source.port}",)
        settings = test_settings(tmp_path, "dst", sync_interval_s=0, seeds=seed)
        async with NodeDaemon(settings) as dest:
            assert dest.sync_service is not None
            deadline = time.monotonic() + 20
            while [p.node_id for p in dest.sync_service.alive_peers()] != ["src"]:
                assert time.monotonic() < deadline, "src never became an alive peer"
                await asyncio.sleep(0.05)
            peers = dest.sync_service.alive_peers()
            await dest.sync_service.run_once(["models", "games"], peers)
            seen = await _samples(dest.port)
    peer = (("peer", "src"),)
    assert seen["shoal_records_pulled_total", (*peer, ("store", "games"))] == 6
    assert seen["shoal_sync_files_total", (("category", "models"), *peer)] == 1
    assert seen["shoal_sync_bytes_total", (("category", "models"), *peer)] == 50_000


def test_failure_texts_map_to_few_reasons() -> None:
    assert failure_reason("src: timed out after 30 s") == "timeout"
    assert failure_reason("circuit open for src/http; retry in 4 s") == "circuit_open"
    assert failure_reason("a.bin: the file no longer has that hash") == "changed"
    assert failure_reason("not enough free space in /data (12 bytes free)") == "no_space"
    assert failure_reason("http://x/v1/sync/models/manifest: HTTP 403: forbidden") == "refused"
    assert failure_reason("Cannot connect to host 10.0.0.2:8770") == "unreachable"
    assert failure_reason("something odd") == "other"
    assert set(map(failure_reason, ["", "x"])) <= set(FAILURE_REASONS)
