"""A node's GPUs in real daemons on 127.0.0.1: the rendezvous of each local rank, the GPUs it
advertises, and two nodes claiming one GPU (through the SHOAL_TEST_FAKE_GPUS seam)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from typer.testing import CliRunner

from config import NodeSettings
from health import ENV_FAKE_GPUS, BreakerRegistry
from node import NodeDaemon
from node.cli import app
from node.election.roles import CANNOT_TRAIN_META
from node.errors import MembershipError
from node.runtime import NodeRuntime
from node.training.launching import Launching
from tests.node.daemons import FAST_ELECTION, test_settings


def _settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    return test_settings(tmp_path, name, **FAST_ELECTION, **flags)


async def _get(port: int, path: str) -> tuple[int, Any]:
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


async def _trains(daemon: NodeDaemon, world_size: int) -> None:
    async def formed() -> bool:
        code, body = await _get(daemon.port, "/v1/rendezvous")
        return code == 200 and body["rank"] is not None and body["world_size"] == world_size

    await _until(formed, 10, f"a training group of {world_size}")


async def test_each_local_rank_has_its_rendezvous(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "r", role="training", backend="gloo", gpus="none")
    settings = settings.model_copy(update={"training_nproc": 2})
    async with NodeDaemon(settings) as daemon:
        await _trains(daemon, 2)
        _, default = await _get(daemon.port, "/v1/rendezvous")
        _, first = await _get(daemon.port, "/v1/rendezvous?local_rank=0")
        _, second = await _get(daemon.port, "/v1/rendezvous?local_rank=1")
        assert default == first
        assert {k: first[k] for k in ("rank", "local_rank", "cuda_device")} == {
            "rank": 0,
            "local_rank": 0,
            "cuda_device": None,
        }
        assert {k: second[k] for k in ("rank", "local_rank", "local_world_size")} == {
            "rank": 1,
            "local_rank": 1,
            "local_world_size": 2,
        }
        assert (second["node_rank"], second["nnodes"], second["world_size"]) == (0, 1, 2)
        assert set(second) == {
            "rank",
            "local_rank",
            "local_world_size",
            "node_rank",
            "nnodes",
            "world_size",
            "master_addr",
            "master_port",
            "backend",
            "generation",
            "term",
            "plan_version",
            "cuda_device",
        }
        _, plan = await _get(daemon.port, "/v1/plan")
        assert plan["plan"]["local_world_sizes"] == [2]
        url = f"http://127.0.0.1:{daemon.port}"
        result = await asyncio.to_thread(CliRunner().invoke, app, ["roles", "--node", url])
        assert result.exit_code == 0, result.output
        assert "world 2" in result.output
        assert " 0-1 " in result.output
        code, error = await _get(daemon.port, "/v1/rendezvous?local_rank=2")
        assert code == 400
        assert set(error) >= {"error", "reason", "status"}
        assert error["status"] == 400
        assert "local_rank 2 is not one of this node's local ranks 0..1" in error["reason"]
        code, error = await _get(daemon.port, "/v1/rendezvous?local_rank=-1")
        assert code == 400
        assert "must be an integer >= 0" in error["reason"]


async def test_a_node_with_gpus_gives_each_local_rank_its_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FAKE_GPUS, "GPU-f0,GPU-f1,GPU-f2")
    settings = _settings(tmp_path, "g", role="training", gpus=[2, 0])
    async with NodeDaemon(settings) as daemon:
        assert daemon.runtime is not None
        assert (daemon.runtime.owned_gpus, daemon.runtime.training_nproc) == ((2, 0), 2)
        await _trains(daemon, 2)
        _, second = await _get(daemon.port, "/v1/rendezvous?local_rank=1")
        assert (second["rank"], second["cuda_device"], second["backend"]) == (1, 1, "nccl")
        _, peers = await _get(daemon.port, "/v1/peers")
        meta = next(p for p in peers["members"] if p["node_id"] == "g")["meta"]
        assert (meta["gpu_uuids"], meta["gpu_count"], meta["training_nproc"]) == (
            "GPU-f2,GPU-f0",
            2,
            2,
        )


async def _pair(tmp_path: Path, gpus: tuple[list[int], list[int]]) -> list[NodeDaemon]:
    names = ("g1", "g2")
    first = NodeDaemon(_settings(tmp_path, "g1", voters=names, gpus=gpus[0]))
    await first.start()
    second = NodeDaemon(
        _settings(tmp_path, "g2", voters=names, gpus=gpus[1], seeds=(f"127.0.0.1:{first.port}",))
    )
    try:
        await second.start()
    except BaseException:
        await first.close()
        raise
    return [first, second]


async def test_two_nodes_claiming_one_gpu_never_both_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FAKE_GPUS, "GPU-shared-0,GPU-shared-1")
    daemons = await _pair(tmp_path, ([0, 1], [1]))
    try:
        reason = "GPU GPU-shared-1 is also claimed by g1"

        async def plans() -> list[dict[str, Any]]:
            return [(await _get(d.port, "/v1/plan"))[1].get("plan") or {} for d in daemons]

        async def conflict_planned() -> bool:
            return all(p.get("cannot_train", {}).get("g2") == reason for p in await plans())

        await _until(conflict_planned, 10, "both nodes to apply a plan that refuses g2 its rank")
        for plan in await plans():  # every plan with both nodes refuses g2
            assert plan["training_ranks"] == ["g1"]
            assert plan["local_world_sizes"] == [2]
            assert plan["cannot_train"] == {"g2": reason}
        _, rendezvous = await _get(daemons[1].port, "/v1/rendezvous")
        assert rendezvous["rank"] is None
        url = f"http://127.0.0.1:{daemons[1].port}"
        result = await asyncio.to_thread(CliRunner().invoke, app, ["roles", "--node", url])
        assert result.exit_code == 0, result.output
        assert "GPU GPU-shared-1 is also claimed" in result.output

        async def shown_in_status() -> bool:
            _, status = await _get(daemons[1].port, "/v1/status")
            return any(reason in problem for problem in status["health_problems"])

        await _until(shown_in_status, 10, "g2's status (the monitor's source) to name the claim")
        _, status = await _get(daemons[0].port, "/v1/status")
        assert not any("claimed" in problem for problem in status["health_problems"])
    finally:
        for daemon in reversed(daemons):
            await daemon.close()


async def test_two_nodes_with_disjoint_gpus_both_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FAKE_GPUS, "GPU-d0,GPU-d1")
    daemons = await _pair(tmp_path, ([0], [1]))
    try:
        for daemon in daemons:
            await _trains(daemon, 2)
        _, body = await _get(daemons[0].port, "/v1/plan")
        assert body["plan"]["cannot_train"] == {}
        assert body["plan"]["local_world_sizes"] == [1, 1]
        ranks = {(await _get(d.port, "/v1/rendezvous"))[1]["rank"] for d in daemons}
        assert ranks == {0, 1}
    finally:
        for daemon in reversed(daemons):
            await daemon.close()


class TightMembership:
    """A membership whose meta has room for `room` characters of cannot_train."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.meta: dict[str, object] = {}

    def update_meta(self, changes: Mapping[str, str]) -> None:
        if len(str(changes[CANNOT_TRAIN_META])) > self.room:
            raise MembershipError("meta is too large to gossip; keep it under 600 bytes of JSON")
        self.meta.update(changes)


@pytest.mark.parametrize(("room", "told"), [(500, 200), (100, 88), (41, 40), (39, None)])
def test_a_cannot_train_reason_is_cut_to_what_the_meta_has_room_for(
    tmp_path: Path, room: int, told: int | None
) -> None:
    runtime = NodeRuntime(_settings(tmp_path, "n"), "n", "127.0.0.1", "0", BreakerRegistry())
    membership = TightMembership(room)
    launching = Launching(runtime, lambda: membership, lambda g, e: None, lambda: None)
    launching.set_cannot_train("the training command failed: " + "x" * 300)
    reason = membership.meta.get(CANNOT_TRAIN_META)
    assert (None if reason is None else len(str(reason))) == told
    assert reason is None or str(reason).startswith("the training command failed")
