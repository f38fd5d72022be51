"""The Python API of docs/python-api.md, exercised the way a training script drives it: against
real daemons on loopback, real SQLite files, real breakers."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from config import NodeSettings, eligible_hosts, load_inventory
from health import (
    BreakerConfig,
    CheckResult,
    CircuitBreaker,
    CircuitOpenError,
    CircuitState,
    ClusterMonitor,
    HealthChecker,
    HealthStatus,
    breaker_for,
    format_health_report,
    reset_all_breakers,
)
from node.daemon import NodeDaemon
from sync import (
    FILE_CATEGORIES,
    FileCatalog,
    HttpTransport,
    MountInfo,
    NodeSyncStats,
    P2PFallbackSync,
    P2PSyncClient,
    PeerRef,
    RecordRequestError,
    StorageKind,
    StoreClosedError,
    SyncCoordinator,
    SyncError,
    detect_storage,
    full_cluster_sync,
    provider_of,
)
from sync.records.fallback import split_host
from tests.node.daemons import test_settings
from wal import SYNC_STARTED, EntryState, WriteAheadLog


def _game(index: int, board_type: str = "hex8") -> dict[str, Any]:
    return {
        "game_id": f"g-{board_type}-{index}",
        "created_at": 1000.0 + index,
        "board_type": board_type,
        "num_players": 2,
        "winner": index % 2,
        "moves": ["a1", "b2"],
    }


def _settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    return test_settings(tmp_path, name, sync_interval_s=0, **flags)


async def _post_games(daemon: NodeDaemon, games: list[dict[str, Any]]) -> None:
    async with (
        ClientSession() as session,
        session.post(f"http://127.0.0.1:{daemon.port}/v1/records/games", json=games) as response,
    ):
        assert response.status == 200, await response.text()


async def _wait_for_peer(daemon: NodeDaemon, peer: str) -> None:
    url = f"http://127.0.0.1:{daemon.port}/v1/sync/status"
    async with asyncio.timeout(20), ClientSession() as session:
        while True:
            async with session.get(url) as response:
                if peer in (await response.json())["peers"]:
                    return
            await asyncio.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
async def source(tmp_path: Path) -> AsyncIterator[NodeDaemon]:
    """A node holding one checkpoint, 12 hex8 games and 3 sq8 games."""
    async with NodeDaemon(_settings(tmp_path, "src")) as daemon:
        checkpoint = daemon.settings.category_path("models") / "run1" / "ckpt.pt"
        checkpoint.parent.mkdir(parents=True)
        checkpoint.write_bytes(os.urandom(200_000))
        await _post_games(daemon, [_game(i) for i in range(12)])
        await _post_games(daemon, [_game(i, "sq8") for i in range(3)])
        yield daemon


# -- sync -----------------------------------------------------------------------------------


async def test_sync_coordinator_sync_category(tmp_path: Path, source: NodeDaemon) -> None:
    """SyncCoordinator(...).sync(category): the files of one category, with their stats in
    total and per peer; a dead peer's failure is named."""
    peer = PeerRef("src", f"http://127.0.0.1:{source.port}")
    dead = PeerRef("dead", f"http://127.0.0.1:{_free_port()}")
    me = PeerRef("me", "http://127.0.0.1:1")
    roots = {category: tmp_path / "me" / category for category in FILE_CATEGORIES}
    async with (
        FileCatalog(roots, tmp_path / "me" / "sync") as catalog,
        HttpTransport() as http,
        SyncCoordinator(catalog, http, self_peer=me, peers_fn=lambda: [peer, dead]) as coordinator,
    ):
        stats = await coordinator.sync("models")
        again = await coordinator.full_cluster_sync(["models"], timeout_s=60.0)
        only_src = await coordinator.full_cluster_sync(["models"], 60.0, peers=[peer])
    assert (stats.files_transferred, stats.bytes_transferred) == (1, 200_000)
    assert stats.duration_seconds > 0
    assert len(stats.errors) == 1
    assert stats.errors[0].startswith("dead: manifest: ")
    assert stats.nodes["src"] == NodeSyncStats(1, 200_000, ())
    (error,) = stats.nodes["dead"].errors
    assert error.startswith("manifest: ")
    assert again.category_stats["models"].files_transferred == 0
    assert (again.failed_nodes, again.nodes_synced) == (("dead",), 1)
    assert again.node_stats["dead"].errors
    assert (only_src.failed_nodes, only_src.nodes_synced) == ((), 1)
    copied = roots["models"] / "run1" / "ckpt.pt"
    original = source.settings.category_path("models") / "run1" / "ckpt.pt"
    assert copied.read_bytes() == original.read_bytes()


async def test_full_cluster_sync_per_category_and_per_node(
    tmp_path: Path, source: NodeDaemon
) -> None:
    """full_cluster_sync(categories, timeout_s): the node syncs now; stats per category and
    per node, and a peer that fails is named."""
    fields = {"eval_id": "text", "created_at": "real"}
    evals = {"evals": {"key": "eval_id", "time_column": "created_at", "fields": fields}}
    seed = (f"127.0.0.1:{source.port}",)
    settings = _settings(tmp_path, "dst", seeds=seed, record_stores=evals)
    async with NodeDaemon(settings) as dest:
        await _wait_for_peer(dest, "src")
        url = f"http://127.0.0.1:{dest.port}"
        stats = await full_cluster_sync(
            ["models", "games"], timeout_s=60.0, node_url=url, settings=settings
        )
        assert stats.failed_nodes == ()
        assert stats.nodes_synced == 1
        assert (stats.total_files, stats.total_bytes) == (1, 200_000)
        models = stats.category_stats["models"]
        assert (models.files_transferred, models.bytes_transferred, models.errors) == (
            1,
            200_000,
            (),
        )
        assert models.duration_seconds > 0
        assert models.nodes == {"src": NodeSyncStats(1, 200_000, ())}
        assert stats.node_stats == {"src": NodeSyncStats(1, 200_000, ())}
        assert stats.record_stats["games"].inserted == 15
        # the source has no "evals" store: that pull fails, and the source is a failed node
        failing = await full_cluster_sync(["evals"], node_url=url, settings=settings)
        assert failing.failed_nodes == ("src",)
        assert failing.nodes_synced == 0
        assert "src" in failing.record_stats["evals"].errors[0]
        (error,) = failing.node_stats["src"].errors
        assert error.startswith("evals: ")


async def test_full_cluster_sync_names_an_unreachable_node(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "nobody")
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(SyncError, match=f"{url}/v1/sync/run: unreachable"):
        await full_cluster_sync(node_url=url, settings=settings)


async def test_p2p_sync_client(source: NodeDaemon) -> None:
    """P2PSyncClient(host, port): get_status(), get_games(ids), pull_games_since(ts)."""
    async with P2PSyncClient("127.0.0.1", source.port) as client:
        status = await client.get_status()
        assert status["count"] == 15
        games = await client.get_games(["g-hex8-1", "g-hex8-2", "missing"])
        assert sorted(g["game_id"] for g in games) == ["g-hex8-1", "g-hex8-2"]
        newer = await client.pull_games_since(1010.0)
        assert [g["game_id"] for g in newer] == ["g-hex8-10", "g-hex8-11"]


async def test_p2p_fallback_sync_falls_back(tmp_path: Path, source: NodeDaemon) -> None:
    """P2PFallbackSync(primary_host, fallback_hosts, timeout).pull_games(board_type, min_games):
    a dead primary and a host with too few games are skipped, each with its reason."""
    dead = f"127.0.0.1:{_free_port()}"
    async with NodeDaemon(_settings(tmp_path, "few")) as few:
        await _post_games(few, [_game(i) for i in range(2)])
        hosts = [f"127.0.0.1:{few.port}", f"127.0.0.1:{source.port}"]
        async with P2PFallbackSync(dead, hosts, timeout=10.0) as fallback:
            result = await fallback.pull_games(board_type="hex8", min_games=5)
            assert result.host == hosts[1]
            assert len(result.games) == 12
            assert {g["board_type"] for g in result.games} == {"hex8"}
            assert [host for host, _ in result.errors] == [dead, hosts[0]]
            assert "fewer than min_games=5" in result.errors[1][1]
            with pytest.raises(RecordRequestError, match=f"{dead}: .*; {hosts[0]}: .*; {hosts[1]}"):
                await fallback.pull_games(board_type="sq8", min_games=5)
        with pytest.raises(StoreClosedError):
            await fallback.pull_games()


def test_fallback_hosts_are_parsed_and_each_asked_once() -> None:
    assert split_host("10.0.0.1") == ("10.0.0.1", 8770)
    assert split_host("10.0.0.1:9000") == ("10.0.0.1", 9000)
    assert split_host("[::1]:9000") == ("::1", 9000)
    assert split_host("::1") == ("::1", 8770)
    with pytest.raises(ValueError, match="'h:x': port must be a number"):
        split_host("h:x")
    fallback = P2PFallbackSync("a", ["b", "a", "c:1", "b"], timeout=1.0)
    assert fallback.hosts == ("a", "b", "c:1")
    with pytest.raises(ValueError, match="timeout must be positive"):
        P2PFallbackSync("a", timeout=0)


# -- WAL ------------------------------------------------------------------------------------


async def test_wal_append_commit_rollback_pending_cleanup(tmp_path: Path) -> None:
    """append(entry_type, payload) -> id, commit, rollback, pending(), cleanup(older_than_s)."""
    settings = _settings(tmp_path, "walnode")
    async with NodeDaemon(settings):
        pass  # the daemon creates the node's WAL
    async with WriteAheadLog(settings.wal_path) as wal:  # the node's WAL, from its settings
        done = await wal.append("my_export", {"game_id": "g-1"})  # users log their own types
        undone = await wal.append(SYNC_STARTED, {"category": "models"})
        open_one = await wal.append(SYNC_STARTED, {"category": "games"})
        await wal.commit(done)
        await wal.rollback(undone, reason="peer died")
        assert [entry.id for entry in await wal.pending()] == [open_one]
        entry = await wal.get(undone)
        assert entry is not None
        assert entry.state is EntryState.ROLLED_BACK
        assert await wal.cleanup(older_than_s=3600) == 0
        assert await wal.cleanup(older_than_s=0) == 2
        assert await wal.get(done) is None
        assert [entry.id for entry in await wal.pending()] == [open_one]


# -- breakers -------------------------------------------------------------------------------


async def test_circuit_breaker_seed_usage() -> None:
    """CircuitBreaker(name, config) as `async with`, breaker_for(host), reset(),
    reset_all_breakers(), CircuitOpenError."""
    config = BreakerConfig(failure_threshold=2, recovery_timeout_s=60.0, half_open_requests=3)
    breaker = CircuitBreaker("sync-host-1", config)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            async with breaker:
                raise ConnectionError("refused")
    assert breaker.state is CircuitState.OPEN
    with pytest.raises(CircuitOpenError):
        async with breaker:
            pass
    breaker.reset()
    async with breaker:
        pass
    assert breaker.state is CircuitState.CLOSED

    host = breaker_for("100.64.0.1")
    assert breaker_for("100.64.0.1") is host
    for _ in range(host.snapshot().consecutive_failures, 5):
        with pytest.raises(OSError, match="unreachable"):
            async with host:
                raise OSError("unreachable")
    assert host.state is CircuitState.OPEN
    reset_all_breakers()
    assert host.state is CircuitState.CLOSED


# -- health ---------------------------------------------------------------------------------


async def test_health_checker_seed_usage() -> None:
    """HealthChecker().add_check(name, fn), run_checks(), summary(), format_health_report."""

    async def disk() -> CheckResult:
        return CheckResult(HealthStatus.HEALTHY, "42% used", {"used_pct": 42.0})

    async def gpu() -> CheckResult:
        raise RuntimeError("NVML gone")

    checker = HealthChecker(fail_threshold=1)
    checker.add_check("disk", disk)
    checker.add_check("gpu", gpu)
    health = await checker.run_checks()
    assert health.status is HealthStatus.UNHEALTHY
    assert checker.summary() == health
    report = format_health_report(health)
    assert report.splitlines()[0].startswith("health: UNHEALTHY")
    assert "disk" in report
    assert "42% used" in report
    assert "NVML gone" in report


# -- storage --------------------------------------------------------------------------------


def test_storage_providers_seed_usage(tmp_path: Path) -> None:
    """detect_storage(paths) -> providers; provider_of(providers, category) with get_paths()
    and get_capabilities()."""
    paths = {"models": tmp_path / "models", "games": Path("/mnt/shared/games")}
    mounts = [
        MountInfo("/dev/sda1", "/", "ext4"),
        MountInfo("nas:/export", "/mnt/shared", "nfs4"),
    ]
    providers = detect_storage(paths, mounts)
    shared = provider_of(providers, "games")
    local = provider_of(providers, "models")
    assert shared is not None
    assert local is not None
    assert shared.kind is StorageKind.NFS
    assert local.kind is StorageKind.LOCAL
    assert shared.get_paths() == {"games": Path("/mnt/shared/games")}
    assert shared.get_capabilities().shared
    assert not local.get_capabilities().shared
    assert local.get_capabilities().persistent
    assert detect_storage({"models": tmp_path}), "this host's own mounts are read"


# -- hosts ----------------------------------------------------------------------------------


def test_inventory_seed_usage(tmp_path: Path) -> None:
    """load_inventory(path), eligible_hosts(inventory, role=..., labels=...)."""
    path = tmp_path / "hosts.yaml"
    path.write_text(
        "hosts:\n"
        "  gpu-a: {ssh_host: 10.0.0.1, role: training, labels: {board: hex8, players: '2'}}\n"
        "  gpu-b: {ssh_host: 10.0.0.2, role: auto, labels: {board: hex8, players: '4'}}\n"
        "  gpu-c: {ssh_host: 10.0.0.3, role: selfplay, labels: {board: hex8, players: '2'}}\n"
        "  gpu-d: {ssh_host: 10.0.0.4, status: disabled, labels: {board: hex8, players: '2'}}\n"
    )
    hosts = load_inventory(path)
    board = {"board": "hex8", "players": "2"}
    assert sorted(eligible_hosts(hosts, labels=board)) == ["gpu-a", "gpu-c"]
    assert sorted(eligible_hosts(hosts, role="training", labels=board)) == ["gpu-a"]


# -- monitor --------------------------------------------------------------------------------


async def test_cluster_monitor_status_and_watch(source: NodeDaemon) -> None:
    """ClusterMonitor(nodes=...).get_cluster_status() and watch(interval_s)."""
    async with ClusterMonitor(nodes=[f"http://127.0.0.1:{source.port}"]) as monitor:
        status = await monitor.get_cluster_status()
        assert [row.node_id for row in status.nodes] == ["src"]
        assert status.nodes[0].state == "alive"
        started = time.monotonic()
        seen = []
        async for update in monitor.watch(0.2):
            seen.append(update.time)
            if len(seen) == 2:
                break
        waited = time.monotonic() - started
        print(f"two watch updates 0.2 s apart took {waited:.2f} s")
        assert seen[1] > seen[0]
        assert waited >= 0.2
