"""Auto-stop with a fake NVML reading, a fake clock and the `local` provider: stops after the
idle window, never while a job runs, a run lock is held, a GPU is busy, or a check fails."""

from __future__ import annotations

import asyncio
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from config import parse_inventory
from node.errors import ProviderError
from node.providers import (
    LAST_DECISION_KEY,
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
    recover_interrupted,
    should_act,
    take_sample,
)
from node.providers.autostop import disabled_status
from node.providers.own import locks_held_here
from node.runtime import AutostopDecisionJson, AutostopStatusJson
from wal import EntryState, WriteAheadLog


@dataclass
class FakeNode:
    """What the checks read: running jobs, the run lock, GPU utilisation (fake NVML)."""

    jobs: int = 0
    locked: bool = False
    gpus: list[float | None] = field(default_factory=lambda: [0.0, 1.0])
    fail: str | None = None
    now: float = 0.0

    async def running_jobs(self) -> int:
        if self.fail == "jobs":
            raise RuntimeError("daemon did not answer")
        return self.jobs

    async def run_locks_held(self) -> list[str]:
        if self.fail == "locks":
            raise ProviderError("no coordinator known")
        return ["run:train"] if self.locked else []

    async def gpu_utilization(self) -> list[float | None]:
        if self.fail == "nvml":
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return list(self.gpus)

    def checks(self) -> IdleChecks:
        return IdleChecks(self.running_jobs, self.run_locks_held, self.gpu_utilization)


class Recorder:
    """A provider that only records what it was asked to stop, and the node.autostop entries
    pending in `wal` at that moment (the decision must be durable before acting)."""

    name = "recorder"

    def __init__(self, wal: WriteAheadLog | None = None, refuse: bool = False) -> None:
        self.stopped: list[str] = []
        self.pending_at_stop: list[int] = []
        self.wal = wal
        self.refuse = refuse

    async def acquire(self, query: GPUQuery) -> NodeHandle:
        raise ProviderError("recorder: acquires nothing")

    async def release(self, handle: NodeHandle) -> None:
        raise ProviderError("recorder: releases nothing")

    async def start(self, handle: NodeHandle) -> ActionResult:
        return ActionResult(handle, False, "recorder")

    async def stop(self, handle: NodeHandle) -> ActionResult:
        if self.wal is not None:
            self.pending_at_stop = [e.id for e in await self.wal.pending(WAL_ENTRY_TYPE)]
        if self.refuse:
            raise ProviderError("recorder: the cloud API said no")
        self.stopped.append(handle.id)
        return ActionResult(handle.with_state(STOPPED), True, "stopped")

    async def list(self) -> list[NodeHandle]:
        return []


POLICY = AutostopPolicy(idle_s=10.0, action="stop", gpu_util_threshold=5.0, check_interval_s=1.0)


async def tick(auto: AutoStop, node: FakeNode, seconds: int) -> list[AutostopDecisionJson]:
    """Advance the fake clock one second at a time, checking each time; the actions taken, as
    JSON."""
    acted: list[AutostopDecisionJson] = []
    for _ in range(seconds):
        node.now += 1.0
        result = await auto.check_once()
        if result is not None:
            acted.append(result.to_json())
    return acted


def test_should_act_needs_a_whole_idle_window() -> None:
    samples = [IdleSample(0, True), IdleSample(5, False, ("job",)), IdleSample(6, True)]
    assert not should_act(samples, 15.9, POLICY)
    assert should_act(samples, 16.0, POLICY)
    assert not should_act([*samples, IdleSample(17, False, ("gpu",))], 30.0, POLICY)


async def test_every_busy_finding_is_a_reason() -> None:
    node = FakeNode(jobs=2, locked=True, gpus=[83.0, 1.0, None])
    sample = await take_sample(node.checks(), 5.0, 1.0)
    assert not sample.idle
    assert sample.reasons == (
        "2 jobs running",
        "run lock held: run:train",
        "gpu 0 at 83%",
        "gpu 2 read failed",
    )
    node.jobs, node.locked, node.fail = 1, False, "nvml"
    sample = await take_sample(node.checks(), 5.0, 2.0)
    assert sample.reasons == ("job running", "gpu read failed: NVML_ERROR_UNKNOWN")
    node.jobs, node.fail, node.gpus = 0, "locks", [4.9]
    sample = await take_sample(node.checks(), 5.0, 3.0)
    assert sample.reasons == ("run lock check failed: no coordinator known",)
    node.fail = None
    assert (await take_sample(node.checks(), 5.0, 4.0)).idle


async def test_stops_after_the_window_and_never_while_busy(tmp_path: Path) -> None:
    node = FakeNode(jobs=1)
    async with (
        LocalProvider(tmp_path / "nodes", capacity=1) as local,
        WriteAheadLog(tmp_path / "wal.db") as wal,
    ):
        handle = await local.acquire(GPUQuery())
        auto = AutoStop(local, handle, POLICY, node.checks(), wal=wal, clock=lambda: node.now)
        assert await tick(auto, node, 30) == []  # a job runs the whole time
        assert auto.status()["busy_reasons"] == ["job running"]
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


async def test_the_decision_is_in_the_wal_before_the_provider_acts(tmp_path: Path) -> None:
    node = FakeNode()
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        recorder = Recorder(wal)
        handle = NodeHandle(provider="recorder", id="n1", ssh=None)
        auto = AutoStop(recorder, handle, POLICY, node.checks(), wal=wal, clock=lambda: node.now)
        acted = await tick(auto, node, 12)
        assert recorder.stopped == ["n1"]
        assert recorder.pending_at_stop == [acted[0]["entry"]]
        assert await wal.pending() == []
        assert await wal.state_get(LAST_DECISION_KEY) == acted[0]
        assert auto.status()["state"] == "acted"


async def test_a_refused_stop_is_rolled_back_and_needs_a_new_window(tmp_path: Path) -> None:
    node = FakeNode()
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        recorder = Recorder(wal, refuse=True)
        handle = NodeHandle(provider="recorder", id="n1", ssh=None)
        auto = AutoStop(recorder, handle, POLICY, node.checks(), wal=wal, clock=lambda: node.now)
        with pytest.raises(ProviderError, match="said no"):
            await tick(auto, node, 12)
        entry = await wal.get(1)
        assert entry is not None
        assert entry.state == EntryState.ROLLED_BACK
        assert "said no" in str(entry.error)
        assert auto.acted is None
        assert auto.last_decision is not None
        assert "failed" in str(auto.last_decision.outcome)
        recorder.refuse = False
        assert await tick(auto, node, 9) == []  # not retried at every check: a new window
        assert len(await tick(auto, node, 3)) == 1
        assert recorder.stopped == ["n1"]


async def test_dry_run_audits_again_only_after_another_window(tmp_path: Path) -> None:
    node = FakeNode()
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        recorder = Recorder()
        handle = NodeHandle(provider="recorder", id="n1", ssh=None)
        auto = AutoStop(
            recorder, handle, POLICY, node.checks(), wal=wal, dry_run=True, clock=lambda: node.now
        )
        assert len(await tick(auto, node, 11)) == 1
        assert await tick(auto, node, 9) == []
        assert len(await tick(auto, node, 2)) == 1
        assert recorder.stopped == []
        assert auto.acted is None


async def test_an_interrupted_decision_is_reported_not_repeated(tmp_path: Path) -> None:
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        entry = await wal.append(WAL_ENTRY_TYPE, {"node": "n1", "action": "stop", "dry_run": False})
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        found = [decision.to_json() for decision in await recover_interrupted(wal)]
        assert [d["entry"] for d in found] == [entry]
        assert found[0]["recovered"] is True
        assert "not repeated" in found[0]["outcome"]
        stored = await wal.get(entry)
        assert stored is not None
        assert stored.state == EntryState.COMMITTED
        assert await wal.state_get(LAST_DECISION_KEY) == found[0]
        assert await recover_interrupted(wal) == []
        recorder = Recorder()
        auto = AutoStop(recorder, NodeHandle("recorder", "n1", None), POLICY, FakeNode().checks())
        auto.wal = wal
        await auto.load()
        assert auto.status()["last_decision"] == found[0]


def test_which_locks_of_the_table_are_held_for_this_node() -> None:
    table = {
        "locks": {
            "run:a": {"holder": "run-1"},
            "run:b": {"holder": "run-2"},
            "mine": {"holder": "n1:trainer"},
            "host": {"holder": "box7:4242:ab12cd34"},
            "free": {"holder": None},
            "other": {"holder": "n2:trainer"},
            "n1x": {"holder": "n10"},
        },
        "runs": {"run-1": {"job_node": "n1"}, "run-2": {"job_node": "n2"}},
    }
    assert locks_held_here(table, "n1", "box7") == ["host", "mine", "run:a"]
    assert locks_held_here({"locks": "garbled"}, "n1", "box7") == []


async def test_an_unreadable_kept_decision_is_not_shown(tmp_path: Path) -> None:
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        await wal.state_set(LAST_DECISION_KEY, {"node": "n1", "outcome": 5})
        auto = AutoStop(Recorder(), NodeHandle("recorder", "n1", None), POLICY, FakeNode().checks())
        auto.wal = wal
        await auto.load()
        assert auto.last_decision is None
        assert auto.status()["last_decision"] is None


async def test_the_status_objects_are_autostop_status_json() -> None:
    every = set(typing.get_type_hints(AutostopStatusJson))
    node = FakeNode()
    auto = AutoStop(
        Recorder(),
        NodeHandle("recorder", "n1", None),
        POLICY,
        node.checks(),
        clock=lambda: node.now,
    )
    await tick(auto, node, 3)
    assert set(auto.status()) == every
    assert set(disabled_status()) == {"enabled", "state", "last_decision"}
