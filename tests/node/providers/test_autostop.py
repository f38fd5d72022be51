"""Auto-stop with a fake NVML reading, a fake clock and the `local` provider: stops after the
idle window, never while a job runs, a run lock is held, a GPU is busy, or a check fails."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from config import parse_inventory
from node.errors import ProviderError
from node.providers import (
    RUNNING,
    STOPPED,
    WAL_ENTRY_TYPE,
    ActionResult,
    AutoStop,
    AutostopPolicy,
    GPUQuery,
    IdleChecks,
    IdleSample,
    LocalProvider,
    NodeHandle,
    should_act,
)
from wal import EntryState, WriteAheadLog


@dataclass
class FakeNode:
    """What the checks read: running jobs, the run lock, GPU utilisation (fake NVML)."""

    jobs: int = 0
    locked: bool = False
    gpus: list[float] = field(default_factory=lambda: [0.0, 1.0])
    fail: str | None = None
    now: float = 0.0

    async def running_jobs(self) -> int:
        if self.fail == "jobs":
            raise RuntimeError("daemon did not answer")
        return self.jobs

    async def run_lock_held(self) -> bool:
        return self.locked

    def gpu_utilization(self) -> list[float]:
        if self.fail == "nvml":
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return self.gpus

    def checks(self) -> IdleChecks:
        return IdleChecks(self.running_jobs, self.run_lock_held, self.gpu_utilization)


class Recorder:
    """A provider that only records what it was asked to stop."""

    name = "recorder"

    def __init__(self) -> None:
        self.stopped: list[str] = []

    async def acquire(self, query: GPUQuery) -> NodeHandle:
        raise ProviderError("recorder: acquires nothing")

    async def release(self, handle: NodeHandle) -> None:
        raise ProviderError("recorder: releases nothing")

    async def start(self, handle: NodeHandle) -> ActionResult:
        return ActionResult(handle, False, "recorder")

    async def stop(self, handle: NodeHandle) -> ActionResult:
        self.stopped.append(handle.id)
        return ActionResult(handle.with_state(STOPPED), True, "stopped")

    async def list(self) -> list[NodeHandle]:
        return []


POLICY = AutostopPolicy(idle_s=10.0, action="stop", gpu_util_threshold=5.0, check_interval_s=1.0)


async def tick(auto: AutoStop, node: FakeNode, seconds: int) -> list[dict[str, object]]:
    """Advance the fake clock one second at a time, checking each time; the actions taken."""
    acted: list[dict[str, object]] = []
    for _ in range(seconds):
        node.now += 1.0
        result = await auto.check_once()
        if result is not None:
            acted.append(result)
    return acted


def test_should_act_needs_a_whole_idle_window() -> None:
    samples = [IdleSample(0, True), IdleSample(5, False, "job"), IdleSample(6, True)]
    assert not should_act(samples, 15.9, POLICY)
    assert should_act(samples, 16.0, POLICY)
    assert not should_act([*samples, IdleSample(17, False, "gpu")], 30.0, POLICY)


async def test_stops_after_the_window_and_never_while_busy(tmp_path: Path) -> None:
    node = FakeNode(jobs=1)
    async with (
        LocalProvider(tmp_path / "nodes", capacity=1) as local,
        WriteAheadLog(tmp_path / "wal.db") as wal,
    ):
        handle = await local.acquire(GPUQuery())
        auto = AutoStop(local, handle, POLICY, node.checks(), wal=wal, clock=lambda: node.now)
        assert await tick(auto, node, 30) == []  # a job runs the whole time
        assert auto.status()["last_busy_reason"] == "1 job(s) running"
        node.jobs, node.locked = 0, True
        assert await tick(auto, node, 30) == []  # a run lock is held
        node.locked, node.gpus = False, [2.0, 50.0]
        assert await tick(auto, node, 30) == []  # one GPU is busy
        node.gpus, node.fail = [0.0, 4.9], "nvml"
        assert await tick(auto, node, 30) == []  # NVML fails: counts as busy
        node.fail = "jobs"
        assert await tick(auto, node, 30) == []  # the job check fails: busy
        assert (await local.list())[0].state == RUNNING
        node.fail = None
        assert await tick(auto, node, 9) == []  # idle, but not for the whole window yet
        assert auto.status()["idle_for_s"] == 8.0
        acted = await tick(auto, node, 3)
        assert len(acted) == 1
        assert (await local.list())[0].state == STOPPED
        assert await tick(auto, node, 20) == []  # acts once
        pending = await wal.pending()
        assert pending == []
        entry = await wal.get(1)
        assert entry is not None
        assert entry.entry_type == WAL_ENTRY_TYPE
        assert entry.state == EntryState.COMMITTED
        assert entry.payload["node"] == handle.id
        assert entry.payload["dry_run"] is False


async def test_dry_run_audits_but_does_not_stop(tmp_path: Path) -> None:
    node = FakeNode()
    async with (
        LocalProvider(tmp_path / "nodes", capacity=1) as local,
        WriteAheadLog(tmp_path / "wal.db") as wal,
    ):
        handle = await local.acquire(GPUQuery())
        auto = AutoStop(
            local, handle, POLICY, node.checks(), wal=wal, dry_run=True, clock=lambda: node.now
        )
        acted = await tick(auto, node, 12)
        assert len(acted) == 1
        assert "dry run" in str(acted[0])
        assert (await local.list())[0].state == RUNNING
        entry = await wal.get(1)
        assert entry is not None
        assert entry.payload["dry_run"] is True


async def test_policy_from_inventory_and_the_loop_task() -> None:
    inventory = parse_inventory(
        {"hosts": {"a": {"ssh_host": "10.0.0.1", "autostop": {"idle_minutes": 0.001}}}}
    )
    policy = AutostopPolicy.of_host(inventory.hosts["a"], check_interval_s=0.01)
    assert policy is not None
    assert policy.idle_s == pytest.approx(0.06)
    assert policy.action == "stop"
    assert (
        AutostopPolicy.of_host(parse_inventory({"hosts": {"b": {"ssh_host": "x"}}}).hosts["b"])
        is None
    )

    handle = NodeHandle(provider="recorder", id="n1", ssh=None)
    recorder = Recorder()
    async with AutoStop(recorder, handle, policy, FakeNode().checks()) as auto:
        for _ in range(500):
            if auto.acted is not None:
                break
            await asyncio.sleep(0.01)
    assert recorder.stopped == ["n1"]
    assert auto.acted is not None
