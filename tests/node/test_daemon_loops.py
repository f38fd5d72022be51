"""README promises kept by a real daemon: a push under a stale plan is refused (409) and does
nothing; the background loops (sync, election, discovery) are health components and a failing
sync loop shows degraded with its last error; the WAL's waits come from the timeout table."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from node.daemon import NodeDaemon
from node.plan import FENCE_HEADER, PlanFence
from sync import DEFAULT_PIECE_SIZE, FileTransferError, PeerRef
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.sync.files_fixtures import FileNode
from wal import SYNC_STARTED

DEAD = PeerRef("dead", "http://127.0.0.1:9")


async def _get(port: int, path: str) -> Any:
    async with (
        ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return await response.json()


async def _until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def _component(port: int, name: str) -> dict[str, Any]:
    health = await _get(port, "/v1/health")
    return next(c for c in health["components"] if c["name"] == name)


async def _plan_fence(daemon: NodeDaemon) -> PlanFence:
    async def planned() -> bool:
        return (await _get(daemon.port, "/v1/plan"))["plan"] is not None

    await _until(planned, 10, "the lone node to publish its plan")
    plan = (await _get(daemon.port, "/v1/plan"))["plan"]
    return PlanFence(plan["term"], plan["version"])


async def test_a_push_under_a_stale_plan_is_refused_and_does_nothing(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "b", sync_interval_s=0, **FAST_ELECTION)
    fence: dict[str, str] = {}
    async with (
        NodeDaemon(settings) as b,
        FileNode(tmp_path / "a", "a", piece_size=DEFAULT_PIECE_SIZE, fence=lambda: fence) as a,
    ):
        current = await _plan_fence(b)
        assert current.version >= 1
        sync = await _component(b.port, "sync")
        assert (sync["status"], sync["message"]) == (
            "healthy",
            "background sync is off (sync_interval_s 0)",
        )
        stale = PlanFence(current.term, current.version - 1)
        b_peer = PeerRef("b", f"http://127.0.0.1:{b.port}")
        source = tmp_path / "ckpt.pt"
        source.write_bytes(os.urandom(40_000))

        fence[FENCE_HEADER] = stale.to_header()
        with pytest.raises(FileTransferError, match="stale") as refused:
            await a.sync.push_file(source, "models", "stale/ckpt.pt", b_peer)
        assert refused.value.status == 409
        assert a.breakers.breaker_for("b", "http").snapshot().total_failures == 0  # a refusal
        assert not (settings.category_path("models") / "stale").exists()
        assert b.runtime is not None
        assert b.runtime.wal is not None
        assert (await b.runtime.wal.stats()).appended_total == 0  # nothing was even logged

        async with ClientSession() as session:
            body = {"peer": a.peer.to_json(), "path": "stale/ckpt.pt", "hash": "0" * 64}
            url = f"http://127.0.0.1:{b.port}/v1/sync/models/pull"
            headers = {FENCE_HEADER: stale.to_header()}
            async with session.post(url, json=body, headers=headers) as response:
                answer = await response.json()
                assert response.status == 409
        assert (answer["error"], answer["status"]) == ("stale_fence", 409)
        assert answer["fence"]["current"] == current.to_list()
        assert stale.to_header() in answer["reason"]

        # Under the current fence the push passes the fence check; b then refuses it only
        # because a is not a member of its view (a push from a member is installed:
        # tests/node/test_push_peers.py).
        fence[FENCE_HEADER] = current.to_header()
        with pytest.raises(FileTransferError, match="not an alive member") as not_member:
            await a.sync.push_file(source, "models", "fresh/ckpt.pt", b_peer)
        assert not_member.value.status == 403
        assert await b.runtime.wal.pending(SYNC_STARTED) == []


async def test_background_loops_are_health_components(tmp_path: Path) -> None:
    settings = test_settings(
        tmp_path,
        "n",
        sync_interval_s=0.05,
        **{"timeouts.sqlite_busy_s": 2.5, "timeouts.wal_op_s": 12.0},
        **FAST_ELECTION,
    )
    async with NodeDaemon(settings) as daemon:
        assert daemon.runtime is not None
        assert daemon.runtime.wal is not None
        config = daemon.runtime.wal.config
        assert (config.busy_timeout_s, config.op_timeout_s) == (2.5, 12.0)
        names = {c["name"] for c in (await _get(daemon.port, "/v1/health"))["components"]}
        assert {"sync", "election", "discovery"} <= names

        service = daemon.sync_service
        assert service is not None
        service.alive_peers = lambda: [DEAD]  # type: ignore[method-assign]

        async def sync_degraded() -> bool:
            return bool((await _component(daemon.port, "sync"))["status"] == "degraded")

        await _until(sync_degraded, 15, "the failing sync loop to show degraded")
        sync = await _component(daemon.port, "sync")
        assert "rounds in a row" in sync["message"]
        assert "dead" in sync["message"]  # the last error names the failing peer
        status = await _get(daemon.port, "/v1/status")
        assert status["health"] == "degraded"
        assert any(p.startswith("sync: sync loop failed") for p in status["health_problems"])

        service.alive_peers = lambda: []  # type: ignore[method-assign]

        async def sync_healthy() -> bool:
            return bool((await _component(daemon.port, "sync"))["status"] == "healthy")

        await _until(sync_healthy, 15, "the sync loop to recover")
        election = await _component(daemon.port, "election")
        assert election["status"] == "healthy"
