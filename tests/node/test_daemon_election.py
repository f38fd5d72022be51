"""The election wired into real daemons on 127.0.0.1: one coordinator, plans, rendezvous."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from typer.testing import CliRunner

from config import NodeSettings
from node import NodeDaemon
from node.cli import app
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.providers.fake_nvml import install_fake_nvml


def _settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    return test_settings(tmp_path, name, **FAST_ELECTION, **flags)


async def _get(port: int, path: str) -> Any:
    async with (
        ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.json()


async def _until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.parametrize(
    ("util", "role", "backend"),
    [((), "selfplay", "gloo"), ((0.0,), "training", "nccl")],
    ids=["no-gpu", "one-gpu"],
)
async def test_lone_node_coordinates_itself(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    util: tuple[float, ...],
    role: str,
    backend: str,
) -> None:
    """An `auto` node plans for itself from the GPUs NVML shows it (the fake NVML fixes them,
    whatever this host has): without a GPU it does self-play, with one it trains on NCCL."""
    install_fake_nvml(tmp_path, monkeypatch).set(*util)
    async with NodeDaemon(_settings(tmp_path, "solo")) as daemon:

        async def coordinating() -> bool:
            _, status = await _get(daemon.port, "/v1/status")
            return bool(status["coordinator"] == "solo" and status["plan_version"] is not None)

        await _until(coordinating, 5, "the lone node to coordinate")
        status, plan = await _get(daemon.port, "/v1/plan")
        assert status == 200
        assert plan["plan"]["roles"] == {"solo": role}
        assert plan["plan"]["group"]["backend"] == backend


async def test_three_voters_elect_one_coordinator_and_fail_over(tmp_path: Path) -> None:
    names = ["v1", "v2", "v3"]
    daemons = {}
    first = NodeDaemon(
        _settings(tmp_path, "v1", voters=tuple(names), backend="gloo", role="training")
    )
    await first.start()
    daemons["v1"] = first
    seed = (f"127.0.0.1:{first.port}",)
    try:
        for name in names[1:]:
            daemon = NodeDaemon(
                _settings(
                    tmp_path, name, voters=tuple(names), seeds=seed, backend="gloo", role="training"
                )
            )
            await daemon.start()
            daemons[name] = daemon

        async def statuses() -> dict[str, dict[str, Any]]:
            return {n: (await _get(d.port, "/v1/status"))[1] for n, d in daemons.items()}

        async def agreed() -> bool:
            seen = await statuses()
            coordinators = {s["coordinator"] for s in seen.values()}
            if (
                len(coordinators) != 1
                or None in coordinators
                or not all(s["role"] == "training" for s in seen.values())
            ):
                return False
            # a plan made before v3 joined may be agreed first (a loaded host): wait for the 3
            _, shown = await _get(daemons["v2"].port, "/v1/rendezvous")
            return bool(shown.get("world_size") == 3)

        await _until(agreed, 10, "one coordinator and a 3-node training plan")
        leader = next(iter({s["coordinator"] for s in (await statuses()).values()}))
        _, rendezvous = await _get(daemons["v2"].port, "/v1/rendezvous")
        assert rendezvous["world_size"] == 3
        assert rendezvous["backend"] == "gloo"
        assert rendezvous["rank"] in (0, 1, 2)
        old_term = (await statuses())[leader]["term"]

        await daemons.pop(leader).close()

        async def failed_over() -> bool:
            seen = await statuses()
            coordinators = {s["coordinator"] for s in seen.values()}
            return (
                len(coordinators) == 1
                and leader not in coordinators
                and None not in coordinators
                and all(s["term"] > old_term for s in seen.values())
            )

        await _until(failed_over, 10, "a new coordinator after the old one left")

        async def replanned() -> bool:
            seen = [(await _get(d.port, "/v1/rendezvous"))[1] for d in daemons.values()]
            return all(r.get("world_size") == 2 for r in seen)

        await _until(replanned, 10, "a 2-node training plan")
        survivor = next(iter(daemons.values()))
        url = f"http://127.0.0.1:{survivor.port}"
        result = await asyncio.to_thread(CliRunner().invoke, app, ["roles", "--node", url])
        assert result.exit_code == 0, result.output
        assert "training" in result.output
    finally:
        for daemon in daemons.values():
            await daemon.close()


async def test_a_minority_of_the_voter_set_never_elects(tmp_path: Path) -> None:
    voters = ("m1", "m2", "m3")
    async with NodeDaemon(_settings(tmp_path, "m1", voters=voters)) as daemon:
        await asyncio.sleep(1.5)  # several election timeouts
        _, status = await _get(daemon.port, "/v1/status")
        assert status["coordinator"] is None
        code, body = await _get(daemon.port, "/v1/rendezvous")
        assert code == 409
        assert "no role plan yet" in body["reason"]


async def test_daemon_launches_the_training_command_with_the_rendezvous(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    script = (
        "import json, os, sys, time; "
        "keys = ['MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
        "'SHOAL_GENERATION', 'SHOAL_DAEMON_URL']; "
        f"open({str(out)!r}, 'w').write(json.dumps({{k: os.environ.get(k) for k in keys}})); "
        "time.sleep(60)"
    )
    settings = _settings(
        tmp_path,
        "trainer",
        role="training",
        backend="gloo",
        training_command=(sys.executable, "-c", script),
    )
    async with NodeDaemon(settings) as daemon:

        async def launched() -> bool:
            return out.exists() and out.stat().st_size > 0

        await _until(launched, 10, "the training command to start")
        env = json.loads(out.read_text())
        _, rendezvous = await _get(daemon.port, "/v1/rendezvous")
        assert env["RANK"] == "0"
        assert env["WORLD_SIZE"] == "1"
        assert env["LOCAL_RANK"] == "0"
        assert env["MASTER_PORT"] == str(rendezvous["master_port"])
        assert env["SHOAL_GENERATION"] == str(rendezvous["generation"])
        assert env["SHOAL_DAEMON_URL"] == f"http://127.0.0.1:{daemon.port}"


async def test_status_drops_a_coordinator_that_is_gone(tmp_path: Path) -> None:
    names = ("w1", "w2", "w3")
    daemons: dict[str, NodeDaemon] = {}
    try:
        for name in names:
            seeds = (f"127.0.0.1:{daemons['w1'].port}",) if daemons else ()
            daemon = NodeDaemon(_settings(tmp_path, name, voters=names, seeds=seeds))
            await daemon.start()
            daemons[name] = daemon

        async def elected() -> bool:
            seen = [(await _get(d.port, "/v1/status"))[1]["coordinator"] for d in daemons.values()]
            return len(set(seen)) == 1 and seen[0] is not None

        await _until(elected, 10, "a coordinator")
        leader = (await _get(daemons["w1"].port, "/v1/status"))[1]["coordinator"]
        others = [n for n in names if n != leader]
        await daemons.pop(leader).close()
        await daemons.pop(others[0]).close()
        survivor = daemons[others[1]]

        async def dropped() -> bool:
            return (await _get(survivor.port, "/v1/status"))[1]["coordinator"] is None

        await _until(dropped, 5, "the survivor to stop naming the dead coordinator")
    finally:
        for daemon in daemons.values():
            await daemon.close()


async def test_a_node_whose_training_keeps_dying_gives_its_rank_away(tmp_path: Path) -> None:
    """t1 takes the one training rank (node id order), its command cannot even start (a long
    missing path: the gossiped reason is cut short); after two failures it reports itself unable
    to train and the next plan gives the rank to t2. One failure window later it offers itself
    again (and gets its rank back: it comes first)."""
    names = ("t1", "t2")
    crash = (str(tmp_path / ("x" * 200) / ("y" * 200) / "no-such-trainer"),)
    run = (sys.executable, "-c", "import time; time.sleep(60)")
    daemons: dict[str, NodeDaemon] = {}
    try:
        for name, command in zip(names, (crash, run), strict=True):
            seeds = (f"127.0.0.1:{daemons['t1'].port}",) if daemons else ()
            settings = _settings(
                tmp_path,
                name,
                voters=names,
                seeds=seeds,
                role="training",
                backend="gloo",
                max_training=1,
                training_command=command,
                training_max_failures=2,
                training_failure_window_s=8.0,
            )
            daemon = NodeDaemon(settings)
            await daemon.start()
            daemons[name] = daemon

        async def plan_of(name: str) -> dict[str, Any]:
            _, document = await _get(daemons[name].port, "/v1/plan")
            return document.get("plan") or {}

        async def moved() -> bool:
            plans = [await plan_of(name) for name in names]
            return all(p.get("training_ranks") == ["t2"] for p in plans)

        started = time.monotonic()
        await _until(moved, 60, "the rank to move from t1 (failing) to t2")
        print(f"rank moved after {time.monotonic() - started:.1f} s")
        plan = await plan_of("t2")
        reason = plan["cannot_train"]["t1"]
        assert reason.startswith("training command failed 2 times in 8 s; last: cannot start")
        assert len(reason) == 200
        assert plan["roles"]["t1"] == "selfplay"

        async def degraded() -> bool:
            # a backoff between the failures is degraded too: wait for the give-up's reason
            _, health = await _get(daemons["t1"].port, "/v1/health")
            training = [c for c in health["components"] if c["name"] == "training"]
            return (
                bool(training)
                and training[0]["status"] == "degraded"
                and (reason in training[0]["message"])
            )

        await _until(degraded, 30, "t1's training component to show degraded with its reason")
        _, health = await _get(daemons["t1"].port, "/v1/health")
        training = next(c for c in health["components"] if c["name"] == "training")
        assert reason in training["message"]
        _, healthy = await _get(daemons["t2"].port, "/v1/health")
        assert {c["name"]: c["status"] for c in healthy["components"]}.get("training") in (
            None,
            "healthy",
        )

        url = f"http://127.0.0.1:{daemons['t2'].port}"
        runner = CliRunner()
        result = await asyncio.to_thread(runner.invoke, app, ["roles", "--node", url])
        assert result.exit_code == 0, result.output
        assert "cannot train" in result.output
        assert "training command failed" in result.output
        result = await asyncio.to_thread(runner.invoke, app, ["roles", "--node", url, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["plan"]["cannot_train"] == {"t1": reason}

        async def offered_again() -> bool:
            plans = [await plan_of(name) for name in names]
            return all(p.get("cannot_train") == {} for p in plans)

        await _until(offered_again, 30, "t1 to offer itself again after one window")
    finally:
        for daemon in daemons.values():
            await daemon.close()
