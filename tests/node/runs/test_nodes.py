"""A run's nodes through a provider: the stopped nodes chosen, exactly those started before
(again harmlessly) and stopped after."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from config import Inventory, parse_inventory
from node.errors import LockError, ProviderError, RunError
from node.locks import LockTable
from node.locks.table import put_run
from node.providers import RUNNING, STOPPED, ActionResult, GPUQuery, NodeHandle, StaticProvider
from node.runs import LocalResults, RunService, parse_run_spec
from node.runs.nodes import ProviderNodes
from node.runs.queue import RunRecord, RunStep, new_run, with_step


class RecordingProvider:
    """A provider seam: two nodes, n1 stopped and n2 running; records start and stop calls."""

    name = "fake"

    def __init__(self, fail: bool = False) -> None:
        self.handles = {
            "n1": NodeHandle("fake", "n1", None, STOPPED),
            "n2": NodeHandle("fake", "n2", None, RUNNING),
        }
        self.calls: list[str] = []
        self.fail = fail

    async def acquire(self, query: GPUQuery) -> NodeHandle:
        raise ProviderError("not used")

    async def release(self, handle: NodeHandle) -> None:
        raise ProviderError("not used")

    async def start(self, handle: NodeHandle) -> ActionResult:
        if self.fail:
            raise ProviderError(f"{handle.id} will not boot")
        self.calls.append(f"start {handle.id}")
        self.handles[handle.id] = dataclasses.replace(handle, state=RUNNING)
        return ActionResult(self.handles[handle.id], True, "booted")

    async def stop(self, handle: NodeHandle) -> ActionResult:
        self.calls.append(f"stop {handle.id}")
        self.handles[handle.id] = dataclasses.replace(handle, state=STOPPED)
        return ActionResult(self.handles[handle.id], True, "halted")

    async def list(self) -> list[NodeHandle]:
        return list(self.handles.values())


RUN = new_run(parse_run_spec({"argv": ["true"]}, {}), 1)


async def test_only_the_nodes_a_run_started_are_stopped() -> None:
    provider = RecordingProvider()
    nodes = ProviderNodes(provider)
    chosen = await nodes.stopped(RUN)
    assert chosen == ["n1"]
    note = await nodes.start(RUN, chosen)
    assert "n1: booted" in note
    assert await nodes.stopped(RUN) == []
    await nodes.start(RUN, chosen)  # a repeat after a failover starts the same node, not none
    run = new_run(parse_run_spec({"argv": ["true"]}, {}), 1)
    note = await nodes.stop(run.model_copy(update={"started_nodes": tuple(chosen)}))
    assert provider.calls == ["start n1", "start n1", "stop n1"]
    assert "n1: halted" in note


async def test_a_provider_failure_is_a_run_error() -> None:
    with pytest.raises(RunError) as caught:
        await ProviderNodes(RecordingProvider(fail=True)).start(RUN, ["n1"])
    assert caught.value.code == "nodes_not_started"
    assert "will not boot" in caught.value.reason


async def test_the_static_provider_starts_nothing_and_says_so() -> None:
    inventory: Inventory = parse_inventory(
        {"hosts": {"a": {"ssh_host": "127.0.0.1"}, "b": {"ssh_host": "127.0.0.2"}}}
    )
    nodes = ProviderNodes(StaticProvider(inventory))
    started = await nodes.stopped(RUN)
    assert started == []
    assert await nodes.start(RUN, started) == "provider static: no stopped node to start"


class FlakyLocks:
    """The seam RunService writes through: a table in memory whose next `fail` writes are
    refused (a lost quorum, a failover between the start of the nodes and its record)."""

    def __init__(self) -> None:
        self.table = LockTable()
        self.fail = 0
        self.runtime = SimpleNamespace(node_id="n0", address="127.0.0.1", port=1)

    async def apply(self, operation: Any) -> Any:
        changed, answer = operation(self.table, 1, time.time())
        if self.fail:
            self.fail -= 1
            raise LockError(503, "no_lock_quorum", "the write did not reach a majority")
        self.table = changed
        return answer


async def test_a_repeated_start_step_starts_and_records_the_same_nodes(tmp_path: Path) -> None:
    provider = RecordingProvider()
    locks = FlakyLocks()
    service = RunService(
        locks,  # type: ignore[arg-type]
        LocalResults(tmp_path),
        {},
        starter=ProviderNodes(provider),
    )
    queued = new_run(parse_run_spec({"argv": ["true"]}, {}), 1)
    record = with_step(queued, RunStep.LOCKED, fence=[1, 1])
    locks.table = put_run(locks.table, 1, record.run_id, record.to_json())

    def stored() -> RunRecord:
        return service.runs()[record.run_id]

    await service.advance(stored())  # the choice is stored before anything starts
    assert locks.table.runs[record.run_id]["nodes_to_start"] == ["n1"]
    assert provider.calls == []
    locks.fail = 1
    with pytest.raises(LockError):
        await service.advance(stored())  # n1 started, but its record was not stored
    await service.advance(stored())  # repeated: n1 is running now, and still the run's node
    assert stored().step is RunStep.STARTING
    assert stored().started_nodes == ("n1",)
    assert provider.calls == ["start n1", "start n1"]
