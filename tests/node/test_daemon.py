from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from config import NodeSettings
from health import GpuInfo, GpuReader
from node import NodeDaemon, StartupError
from tests.node.daemons import test_settings
from tests.node.providers.fake_nvml import install_fake_nvml

ROOT = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    return test_settings(tmp_path, name, **flags)


@asynccontextmanager
async def _daemon(settings: NodeSettings) -> AsyncIterator[NodeDaemon]:
    async with NodeDaemon(settings) as daemon:
        yield daemon


async def _get(url: str) -> Any:
    async with ClientSession() as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def _host_gpus() -> tuple[list[GpuInfo], str]:
    """What NVML shows on this host, read apart from any daemon, and why it shows none."""
    reader = GpuReader()
    try:
        return await asyncio.to_thread(reader.read_with_reason)
    finally:
        reader.close()


async def test_daemon_serves_status_of_itself(tmp_path: Path) -> None:
    """The gpu component and `gpus` show what this host has: not applicable (with NVML's reason)
    on a host without GPUs, every GPU of a GPU host."""
    host_gpus, reason = await _host_gpus()
    async with _daemon(_settings(tmp_path, "solo")) as daemon:
        assert daemon.port != 0
        status = await _get(f"http://127.0.0.1:{daemon.port}/v1/status")
        assert status["node_id"] == "solo"
        assert status["port"] == daemon.port
        assert status["members"]["alive"] == 1
        assert status["wal"]["pending"] == 0
        assert [gpu["uuid"] for gpu in status["gpus"]] == [gpu.uuid for gpu in host_gpus]
        health = await _get(f"http://127.0.0.1:{daemon.port}/v1/health")
        names = {component["name"] for component in health["components"]}
        assert {"disk", "wal", "wal_backlog", "memory", "gpu"} <= names
        gpu = next(c for c in health["components"] if c["name"] == "gpu")
        if host_gpus:
            assert gpu["status"] in ("healthy", "degraded", "unhealthy"), gpu
            assert gpu["metrics"]["gpus"] == len(host_gpus)
        else:
            assert (gpu["status"], gpu["message"]) == ("not_applicable", reason)
    await daemon.close()  # idempotent


@pytest.mark.parametrize("util", [(), (0.0, 30.0)], ids=["no-gpu", "two-gpus"])
async def test_daemon_reports_the_gpus_nvml_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, util: tuple[float, ...]
) -> None:
    """Through the fake NVML, on any host: the gpu component, `gpus` in /v1/status and the
    gossiped gpu_count follow what NVML shows, none or two."""
    install_fake_nvml(tmp_path, monkeypatch).set(*util)
    async with _daemon(_settings(tmp_path, "solo")) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"
        status = await _get(f"{url}/v1/status")
        assert [gpu["uuid"] for gpu in status["gpus"]] == [
            f"GPU-fake-{i}" for i in range(len(util))
        ]
        assert [gpu["util_pct"] for gpu in status["gpus"]] == list(util)
        health = await _get(f"{url}/v1/health")
        gpu = next(c for c in health["components"] if c["name"] == "gpu")
        if util:
            assert (gpu["status"], gpu["message"]) == ("healthy", "2 GPUs ok")
        else:
            assert (gpu["status"], gpu["message"]) == ("not_applicable", "no NVIDIA GPU found")
        members = (await _get(f"{url}/v1/peers"))["members"]
        meta = next(m["meta"] for m in members if m["node_id"] == "solo")
        assert meta.get("gpu_count") == (len(util) or None)


async def test_two_daemons_join_through_a_seed_and_see_a_leave(tmp_path: Path) -> None:
    async with _daemon(_settings(tmp_path, "a")) as first:
        seed = f"127.0.0.1:{first.port}"
        second = NodeDaemon(_settings(tmp_path, "b", seeds=(seed,)))
        await second.start()
        url = f"http://127.0.0.1:{first.port}/v1/peers"
        deadline = time.monotonic() + 10
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {m["node_id"]: m["state"] for m in (await _get(url))["members"]}
            if states.get("b") == "alive":
                break
            await asyncio.sleep(0.05)
        assert states.get("b") == "alive", states
        await second.close()
        states = {m["node_id"]: m["state"] for m in (await _get(url))["members"]}
        assert states["b"] == "left"


async def test_port_in_use_is_a_startup_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            await NodeDaemon(_settings(tmp_path, "x", port=port)).start()


SIGTERM_LIVENESS_S = 30


def _serve(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "node", "serve", "--data-dir", str(tmp_path / "d"), *args]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_exits_0_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM: leave, stop, exit 0; waiting more than SIGTERM_LIVENESS_S fails (the
    daemon's own bound is shutdown_s, 8 s; the figure is printed)."""
    port = _free_port()
    process = _serve(tmp_path, "--port", str(port), "--no-mdns", "--node-id", "n1")
    try:
        deadline = time.monotonic() + 60  # the start is not what is measured; a loaded CI is slow
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("daemon never listened")
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=SIGTERM_LIVENESS_S) == 0
        print(f"SIGTERM to exit: {time.monotonic() - started:.2f} s")
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
    assert "left the cluster" in output


def test_serve_refuses_public_bind_without_secret(tmp_path: Path) -> None:
    process = _serve(tmp_path, "--bind", "0.0.0.0", "--port", "0", "--no-mdns")
    output = process.communicate(timeout=30)[0]
    assert process.returncode == 2
    assert "refusing to serve beyond loopback without a cluster secret" in output
    assert "Traceback" not in output


def test_serve_refuses_group_readable_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef")
    secret.chmod(0o640)
    process = _serve(tmp_path, "--secret-file", str(secret), "--port", "0", "--no-mdns")
    output = process.communicate(timeout=30)[0]
    assert process.returncode == 2
    assert f"chmod 600 {secret}" in output


def test_serve_stops_on_a_corrupt_wal_naming_the_file(tmp_path: Path) -> None:
    wal = tmp_path / "d" / "wal" / "wal.db"
    wal.parent.mkdir(parents=True)
    wal.write_bytes(b"garbage" * 1000)
    process = _serve(tmp_path, "--port", "0", "--no-mdns")
    output = process.communicate(timeout=30)[0]
    assert process.returncode == 2
    assert str(wal) in output
    assert "--move-aside" in output
    assert "Traceback" not in output


async def test_daemon_ingests_records_durably_and_documents_the_routes(tmp_path: Path) -> None:
    game = {
        "game_id": "g-1",
        "created_at": 1.0,
        "board_type": "hex8",
        "num_players": 2,
        "winner": 1,
        "moves": ["a1", "b2"],
    }
    settings = _settings(tmp_path, "rec")
    async with _daemon(settings) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}"
        async with session.post(f"{url}/v1/records/games", json=[game, game]) as response:
            assert response.status == 200
            assert await response.json() == {"accepted": 1, "duplicates": 1}
        async with session.get(f"{url}/v1/openapi.json") as response:
            paths = (await response.json())["paths"]
        assert "post" in paths["/v1/records/games"]
    assert (settings.category_path("games") / "games.db").exists()
    async with _daemon(settings) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}/v1/records/games/status"
        async with session.get(url) as response:
            assert (await response.json())["count"] == 1


async def test_extra_record_store_from_config(tmp_path: Path) -> None:
    stores = {
        "evals": {
            "key": "eval_id",
            "time_column": "created_at",
            "fields": {"eval_id": "text", "created_at": "real", "score": "real"},
        }
    }
    settings = _settings(tmp_path, "ev", record_stores=stores)
    async with _daemon(settings) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}/v1/records/evals"
        record = {"eval_id": "e1", "created_at": 2.0, "score": 0.5}
        async with session.post(url, json=[record]) as response:
            assert await response.json() == {"accepted": 1, "duplicates": 0}
        async with session.post(url, json=[{"eval_id": "e2", "created_at": 2.0}]) as response:
            assert response.status == 400
            assert "records[0].score" in (await response.json())["reason"]


async def test_bad_extra_record_store_is_a_config_error(tmp_path: Path) -> None:
    from config import ConfigError

    settings = _settings(tmp_path, "bad", record_stores={"x": {"key": "id"}})
    with pytest.raises(ConfigError, match=r"record_stores\.x"):
        await NodeDaemon(settings).start()


async def test_get_accepts_a_thousand_long_keys(tmp_path: Path) -> None:
    games = [
        {
            "game_id": f"selfplay-run-0042-game-{i:08d}",
            "created_at": float(i),
            "board_type": "hex8",
            "num_players": 2,
            "winner": 0,
            "moves": "a1",
        }
        for i in range(1000)
    ]
    async with _daemon(_settings(tmp_path, "get")) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}/v1/records/games"
        async with session.post(url, json=games) as response:
            assert (await response.json())["accepted"] == 1000
        query = [("key", game["game_id"]) for game in games]
        async with session.get(f"{url}/get", params=query) as response:
            assert response.status == 200, await response.text()
            assert len((await response.json())["records"]) == 1000


def test_breaker_config_from_timeouts_inventory_and_environment(tmp_path: Path) -> None:
    from config import load_inventory, load_settings
    from node.boot import breaker_config

    inventory_file = tmp_path / "hosts.yaml"
    inventory_file.write_text(
        "hosts:\n  a: {ssh_host: 10.0.0.1}\n"
        "circuit_breaker: {failure_threshold: 9, recovery_timeout: 12}\n"
    )
    inventory = load_inventory(inventory_file)
    plain = load_settings(env={}).settings
    assert breaker_config(plain, None).failure_threshold == 5
    assert breaker_config(plain, None).recovery_timeout_s == plain.timeouts.breaker_recovery_s
    from_inventory = breaker_config(plain, inventory)
    assert (from_inventory.failure_threshold, from_inventory.recovery_timeout_s) == (9, 12)
    env = load_settings(env={"SHOAL_CIRCUIT_THRESHOLD": "3"}).settings
    assert breaker_config(env, inventory).failure_threshold == 3
    assert breaker_config(env, inventory).recovery_timeout_s == 12


async def test_status_and_peers_commands(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from node.cli import app

    runner = CliRunner()
    async with _daemon(_settings(tmp_path, "cli")) as daemon:
        node = f"http://127.0.0.1:{daemon.port}"
        result = await asyncio.to_thread(runner.invoke, app, ["status", "--node", node, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["node_id"] == "cli"
        table = await asyncio.to_thread(runner.invoke, app, ["status", "--node", node])
        assert "cli at" in table.output
        peers = await asyncio.to_thread(runner.invoke, app, ["peers", "--node", node])
        assert peers.exit_code == 0, peers.output
        assert "cli (self)" in peers.output
    gone = await asyncio.to_thread(runner.invoke, app, ["peers", "--node", node])
    assert gone.exit_code == 1
    assert f"{node}/v1/peers: unreachable" in gone.output


async def test_a_seed_that_starts_later_is_found_by_the_refeed(tmp_path: Path) -> None:
    from node.assembly import DISCOVERY_REFEED_S

    port = _free_port()
    async with _daemon(_settings(tmp_path, "early", seeds=(f"127.0.0.1:{port}",))) as early:
        await asyncio.sleep(1.0)  # the seed's first offers go unanswered
        async with _daemon(_settings(tmp_path, "late", port=port)):
            url = f"http://127.0.0.1:{early.port}/v1/peers"
            deadline = time.monotonic() + DISCOVERY_REFEED_S + 2
            states: dict[str, str] = {}
            while time.monotonic() < deadline:
                states = {m["node_id"]: m["state"] for m in (await _get(url))["members"]}
                if states.get("late") == "alive":
                    break
                await asyncio.sleep(0.1)
            assert states.get("late") == "alive", states
