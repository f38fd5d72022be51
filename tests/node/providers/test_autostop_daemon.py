"""Auto-stop run by the daemon, with a fake NVML: a `local` node stops itself after the idle
window, never while a job runs, a run lock is held, a GPU is busy or cannot be read; dry run
only records; a `static` node's stop is a reported no-op; a decision interrupted by a restart
is reported, not repeated. Each decision is a `node.autostop` WAL entry."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from config import ConfigError, load_settings
from node.daemon import NodeDaemon
from node.providers import (
    LAST_DECISION_KEY,
    RUNNING,
    STOPPED,
    WAL_ENTRY_TYPE,
    AutostopPolicy,
    GPUQuery,
    LocalProvider,
)
from node.providers.static import NO_OP
from node.routes import StatusAnswer
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.jobs.helpers import JobClient, signed_session, write_secret
from tests.node.providers.fake_nvml import FakeGpus, install_fake_nvml
from wal import EntryState, WalEntry, WriteAheadLog

WINDOW_S = 1.2
AUTOSTOP = {"idle_minutes": WINDOW_S / 60, "check_interval_s": 0.1}
HOLD_S = 3 * WINDOW_S
"""How long a busy node is watched not stopping: well past its idle window."""


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpus:
    return install_fake_nvml(tmp_path, monkeypatch)


@contextlib.asynccontextmanager
async def autostop_daemon(
    tmp_path: Path, **flags: Any
) -> AsyncIterator[tuple[NodeDaemon, JobClient]]:
    """An in-process node with a secret and a fast election; jobs left running are killed."""
    flags = {"provider": "local", "autostop": AUTOSTOP, **FAST_ELECTION, **flags}
    settings = test_settings(tmp_path, "n1", secret_file=write_secret(tmp_path), **flags)
    async with NodeDaemon(settings) as daemon, signed_session() as session:
        client = JobClient(f"http://127.0.0.1:{daemon.port}", session)
        try:
            yield daemon, client
        finally:
            _, listing = await client.call("GET", "/v1/jobs?state=running")
            for job in listing["jobs"]:
                await client.kill(job["job_id"], signal="KILL", grace_s=0)
                await client.wait(job["job_id"])


async def autostop_of(client: JobClient) -> dict[str, Any]:
    status, body = await client.call("GET", "/v1/status")
    assert status == 200, body
    assert isinstance(body["autostop"], dict)
    return body["autostop"]


async def wait_for(
    what: str, condition: Callable[[], Awaitable[bool]], timeout_s: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def stays_busy(daemon: NodeDaemon, client: JobClient, reason: str) -> None:
    """The node reports `reason` at once and does not stop for HOLD_S (3 idle windows)."""

    async def busy_for_reason() -> bool:
        state = await autostop_of(client)
        return state["state"] == "busy" and reason in state["busy_reasons"]

    await wait_for(f"autostop busy with {reason!r}", busy_for_reason)
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        state = await autostop_of(client)
        assert not daemon.stop_requested.is_set(), state
        assert state["last_decision"] is None, state
        assert state["idle_for_s"] < WINDOW_S, state
        await asyncio.sleep(0.1)


async def stopped(daemon: NodeDaemon, client: JobClient) -> dict[str, Any]:
    """Waits for the node to stop itself; its last decision."""

    async def requested() -> bool:
        return daemon.stop_requested.is_set()

    await wait_for("the node stops itself", requested)

    async def settled() -> bool:
        return bool((await autostop_of(client))["state"] == "acted")

    await wait_for("the decision is audited", settled)
    decision = (await autostop_of(client))["last_decision"]
    assert isinstance(decision, dict)
    return decision


async def autostop_entries(daemon: NodeDaemon) -> list[WalEntry]:
    wal = daemon.runtime.wal if daemon.runtime is not None else None
    assert wal is not None
    entries = []
    for entry_id in range(1, 200):
        entry = await wal.get(entry_id)
        if entry is not None and entry.entry_type == WAL_ENTRY_TYPE:
            entries.append(entry)
    return entries


async def test_a_local_node_stops_itself_after_the_idle_window(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    async with autostop_daemon(tmp_path) as (daemon, client):
        decision = await stopped(daemon, client)
        assert decision["action"] == "stop"
        assert decision["provider"] == "local"
        assert decision["idle_s"] >= WINDOW_S
        assert decision["outcome"] == "local node n1: the daemon shuts down"
        assert daemon.stop_reason == "local node n1 stopped by auto-stop"
        [entry] = await autostop_entries(daemon)
        assert entry.state == EntryState.COMMITTED
        assert entry.payload["dry_run"] is False
        assert entry.payload["idle_s"] >= WINDOW_S
        assert decision["entry"] == entry.id
        _, status = await client.call("GET", "/v1/status")
        # the OpenAPI response schema
        Draft202012Validator(StatusAnswer.model_json_schema()).validate(status)
        state = status["autostop"]
        assert state["enabled"] is True
        assert state["window_s"] == pytest.approx(WINDOW_S)
        assert state["busy_reasons"] == []
        async with client.session.get(f"{client.base}/metrics") as response:
            metrics = await response.text()
        [line] = [x for x in metrics.splitlines() if x.startswith("shoal_autostop_idle_seconds ")]
        assert float(line.split()[1]) >= WINDOW_S


async def test_never_while_a_job_runs(tmp_path: Path, gpus: FakeGpus) -> None:
    async with autostop_daemon(tmp_path) as (daemon, client):
        job = await client.start(["sleep", "60"])
        await stays_busy(daemon, client, "job running")
        await client.kill(job["job_id"], signal="KILL", grace_s=0)
        await client.wait(job["job_id"])
        decision = await stopped(daemon, client)
        assert decision["idle_s"] >= WINDOW_S


async def test_never_while_a_gpu_is_busy_or_cannot_be_read(tmp_path: Path, gpus: FakeGpus) -> None:
    gpus.set(0.0, 83.0)
    async with autostop_daemon(tmp_path) as (daemon, client):
        await stays_busy(daemon, client, "gpu 1 at 83%")
        gpus.set(None, 0.0)
        await stays_busy(daemon, client, "gpu 0 read failed")
        gpus.fail("NVML_ERROR_GPU_IS_LOST")
        state = await autostop_of(client)
        await stays_busy(
            daemon, client, "gpu read failed: NVML is loaded but cannot count GPUs: "
            "NVML_ERROR_GPU_IS_LOST"
        )  # fmt: skip
        gpus.set(4.9, 0.0)  # below the default threshold of 5%
        await stopped(daemon, client)
        assert state["gpu_util_threshold"] == 5.0


async def test_never_while_this_node_holds_a_run_lock(tmp_path: Path, gpus: FakeGpus) -> None:
    async with autostop_daemon(tmp_path) as (daemon, client):
        job = await client.start(["sleep", "60"])  # busy until the lock is held
        body = {"holder": "n1:trainer", "ttl_s": 60, "wait": True, "wait_s": 10}
        answer: dict[str, Any] = {}

        async def granted() -> bool:
            nonlocal answer
            status, answer = await client.call("POST", "/v1/locks/train/acquire", json=body)
            return status == 200 and bool(answer["granted"])

        await wait_for("the lock is granted (once there is a coordinator)", granted)
        await client.kill(job["job_id"], signal="KILL", grace_s=0)
        await client.wait(job["job_id"])
        await stays_busy(daemon, client, "run lock held: train")
        release = {"holder": "n1:trainer", "fence": answer["fence"]}
        status, answer = await client.call("POST", "/v1/locks/train/release", json=release)
        assert status == 200, answer
        await stopped(daemon, client)


async def test_dry_run_records_what_it_would_do_without_doing_it(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    async with autostop_daemon(tmp_path, autostop={**AUTOSTOP, "dry_run": True}) as (
        daemon,
        client,
    ):

        async def two_audits() -> bool:
            return len(await autostop_entries(daemon)) >= 2

        await wait_for("two dry-run decisions, one per window", two_audits)
        assert not daemon.stop_requested.is_set()
        entries = await autostop_entries(daemon)
        assert all(e.payload["dry_run"] is True for e in entries)
        assert all(e.state == EntryState.COMMITTED for e in entries)
        state = await autostop_of(client)
        assert state["dry_run"] is True
        assert state["state"] != "acted"
        assert state["last_decision"]["outcome"] == "dry run: would stop local/n1"


async def test_a_static_node_reports_its_stop_as_a_no_op(tmp_path: Path, gpus: FakeGpus) -> None:
    async with autostop_daemon(tmp_path, provider="static") as (daemon, client):

        async def acted() -> bool:
            return bool((await autostop_of(client))["state"] == "acted")

        await wait_for("the static node decides", acted)
        state = await autostop_of(client)
        assert state["last_decision"]["outcome"] == NO_OP
        assert state["provider"] == "static"
        assert not daemon.stop_requested.is_set()


async def test_a_stop_interrupted_by_a_restart_is_reported_not_repeated(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    settings = test_settings(tmp_path, "n1", secret_file=write_secret(tmp_path))
    settings.data_dir.mkdir(parents=True)
    async with WriteAheadLog(settings.wal_path) as wal:
        payload = {"provider": "local", "node": "n1", "action": "stop", "dry_run": False}
        entry_id = await wal.append(WAL_ENTRY_TYPE, payload)  # the daemon died while stopping
    long_window = {"idle_minutes": 10.0, "check_interval_s": 0.1}
    async with autostop_daemon(tmp_path, autostop=long_window) as (daemon, client):
        assert not daemon.stop_requested.is_set()
        [entry] = await autostop_entries(daemon)
        assert entry.id == entry_id
        assert entry.state == EntryState.COMMITTED
        state = await autostop_of(client)
        decision = state["last_decision"]
        assert decision["recovered"] is True
        assert decision["entry"] == entry_id
        assert "not repeated" in decision["outcome"]
        _, status = await client.call("GET", "/v1/status")
        assert any("not repeated" in note for note in status["notes"])
        await asyncio.sleep(3 * WINDOW_S)  # checks keep running; nothing is redone
        assert not daemon.stop_requested.is_set()
        assert len(await autostop_entries(daemon)) == 1
    async with WriteAheadLog(settings.wal_path) as wal:
        assert (await wal.state_get(LAST_DECISION_KEY))["recovered"] is True


def test_autostop_settings_are_validated_naming_the_field(tmp_path: Path) -> None:
    def problems(**flags: Any) -> str:
        with pytest.raises(ConfigError) as caught:
            load_settings(env={}, flags=flags)
        return str(caught.value)

    assert "autostop.idle_minutes" in problems(autostop={"idle_minutes": 0})
    assert "autostop.idle_minutes" in problems(autostop={"action": "stop"})
    assert "autostop.action" in problems(autostop={"idle_minutes": 1, "action": "halt"})
    assert "autostop.gpu_util_threshold" in problems(
        autostop={"idle_minutes": 1, "gpu_util_threshold": 101}
    )
    assert "provider" in problems(provider="cloud")
    config = tmp_path / "node.yaml"
    config.write_text("provider: local\nautostop:\n  idle_minutes: 2\n  dry_run: true\n")
    loaded = load_settings(config, env={})
    assert loaded.settings.provider == "local"
    assert loaded.settings.autostop is not None
    assert loaded.settings.autostop.dry_run is True
    policy = AutostopPolicy.of_section(loaded.settings.autostop)
    assert policy.check_interval_s == 12.0
    assert policy.idle_s == 120.0
    assert loaded.sources["autostop.idle_minutes"] == f"file:{config}:3"
    config.write_text("autostop:\n  idle_minutes: -1\n")
    with pytest.raises(ConfigError, match=r"node\.yaml:2.*autostop\.idle_minutes"):
        load_settings(config, env={})


async def test_a_node_of_the_local_provider_ends_its_daemon_when_idle(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    gpus.set(90.0)
    settings = {"autostop": AUTOSTOP}
    async with LocalProvider(tmp_path / "nodes", capacity=1, node_settings=settings) as local:
        handle = await local.acquire(GPUQuery())
        assert handle.url is not None
        async with aiohttp.ClientSession() as session:

            async def status() -> dict[str, Any]:
                async with session.get(f"{handle.url}/v1/status") as response:
                    assert response.status == 200
                    body = await response.json()
                    assert isinstance(body, dict)
                    return body

            async def busy() -> bool:
                autostop = (await status())["autostop"]  # `starting` has no reasons yet
                return bool(autostop.get("busy_reasons") == ["gpu 0 at 90%"])

            await wait_for("the node's GPU reads busy through NVML", busy)
            await asyncio.sleep(HOLD_S)
            assert (await local.list())[0].state == RUNNING
            assert (await status())["autostop"]["provider"] == "local"
            gpus.set(0.0)

            async def down() -> bool:
                return (await local.list())[0].state == STOPPED

            await wait_for("the idle node ends its own daemon", down, timeout_s=60.0)
    wal_path = tmp_path / "nodes" / handle.id / "data" / "wal" / "wal.db"
    async with WriteAheadLog(wal_path) as wal:
        assert await wal.pending(WAL_ENTRY_TYPE) == []
        decision = await wal.state_get(LAST_DECISION_KEY)
        assert decision["outcome"] == f"local node {handle.id}: the daemon shuts down"
        entry = await wal.get(decision["entry"])
        assert entry is not None
        assert entry.state == EntryState.COMMITTED


async def test_without_a_section_the_inventory_host_s_autostop_applies(
    tmp_path: Path, gpus: FakeGpus
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  n1:\n    ssh_host: 127.0.0.1\n"
        "    autostop: {idle_minutes: 10, action: release, gpu_util_threshold: 50}\n"
    )
    async with autostop_daemon(tmp_path, autostop=None, inventory=inventory) as (_, client):
        state = await autostop_of(client)
        assert state["enabled"] is True
        assert state["action"] == "release"
        assert state["window_s"] == 600.0
        assert state["gpu_util_threshold"] == 50.0
        assert state["provider"] == "local"
    (tmp_path / "off").mkdir()
    async with autostop_daemon(tmp_path / "off", autostop=None) as (_, client):
        assert await autostop_of(client) == {
            "enabled": False,
            "state": "off",
            "last_decision": None,
        }
