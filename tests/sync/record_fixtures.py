"""Shared helpers of the record tests: records, open stores, and a served app on 127.0.0.1:0."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestServer

from config import Timeouts
from net import PeerClient
from sync import RecordStore, RecordStores, StoreOptions, record_routes

NODE_ID = "node-a"
SMALL = StoreOptions(busy_timeout_s=5.0, max_wait_s=1.0, idle_checkpoint_s=0.2)


def game(index: int, **overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "game_id": f"g-{index:06d}",
        "created_at": 1_700_000_000.0 + index,
        "board_type": "square8" if index % 2 == 0 else "hex8",
        "num_players": 2,
        "winner": index % 2,
        "moves": [f"m{index}", "e2e4", "e7e5"],
        "quality": (index % 10) / 10,
    }
    record.update(overrides)
    return record


def rollout(index: int) -> dict[str, Any]:
    return {
        "sample_id": f"s-{index:06d}",
        "created_at": 1_700_000_000.0 + index,
        "model_version": 1,
        "payload": {"obs": [index, index + 1], "reward": 0.5},
    }


@contextlib.asynccontextmanager
async def serve(
    stores: Mapping[str, RecordStore], node_id: str = NODE_ID, **options: Any
) -> AsyncIterator[TestServer]:
    """The record routes of `stores` on a real TestServer at 127.0.0.1, port 0."""
    app = web.Application()
    app.add_routes(record_routes(stores, node_id, **options))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


def base_url(server: BaseTestServer) -> str:
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[RecordStores]:
    async with RecordStores(tmp_path / "data", options=SMALL) as opened:
        yield opened


@pytest.fixture
async def server(stores: RecordStores) -> AsyncIterator[TestServer]:
    async with serve(stores) as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        yield client


@pytest.fixture
async def peers() -> AsyncIterator[PeerClient]:
    """The peer client that pulls (net.PeerClient, unsigned, 30 s a request)."""
    async with PeerClient(timeouts=Timeouts(http_request_s=30)) as client:
        yield client
