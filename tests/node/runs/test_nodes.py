"""A run's nodes through a provider: the stopped nodes chosen, exactly those started before
(again harmlessly) and stopped after."""

from __future__ import annotations

import dataclasses

import pytest

from config import Inventory, parse_inventory
from node.errors import ProviderError, RunError
from node.providers import RUNNING, STOPPED, ActionResult, GPUQuery, NodeHandle, StaticProvider
from node.runs.nodes import ProviderNodes


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


async def test_only_the_nodes_a_run_started_are_stopped() -> None:
    provider = RecordingProvider()
    nodes = ProviderNodes(provider)
    chosen = await nodes.stopped({})
    assert chosen == ["n1"]
    note = await nodes.start({}, chosen)
    assert "n1: booted" in note
    assert await nodes.stopped({}) == []
    await nodes.start({}, chosen)  # a repeat after a failover starts the same node, not none
    note = await nodes.stop({"started_nodes": chosen})
    assert provider.calls == ["start n1", "start n1", "stop n1"]
    assert "n1: halted" in note


async def test_a_provider_failure_is_a_run_error() -> None:
    with pytest.raises(RunError) as caught:
        await ProviderNodes(RecordingProvider(fail=True)).start({}, ["n1"])
    assert caught.value.code == "nodes_not_started"
    assert "will not boot" in caught.value.reason


async def test_the_static_provider_starts_nothing_and_says_so() -> None:
    inventory: Inventory = parse_inventory(
        {"hosts": {"a": {"ssh_host": "127.0.0.1"}, "b": {"ssh_host": "127.0.0.2"}}}
    )
    nodes = ProviderNodes(StaticProvider(inventory))
    started = await nodes.stopped({})
    assert started == []
    assert await nodes.start({}, started) == "provider static: no stopped node to start"
