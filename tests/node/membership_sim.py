"""Whole clusters of the real membership code over InMemoryNetwork, with shrunk timing: the
`Cluster` helper shared by tests/node/test_membership_cluster.py and test_membership_partition.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable

from config.timeouts import Timeouts
from node.membership.service import InMemoryNetwork, Membership
from node.membership.timers import ProbeWait
from node.membership.types import EventKind, MemberEvent, MemberState

FAST = Timeouts(
    probe_interval_s=0.05,
    probe_timeout_s=0.02,
    indirect_probe_timeout_s=0.04,
    suspicion_s=0.15,
    dead_reap_s=30.0,
)
PORT = 7000


def host(index: int) -> str:
    return f"10.0.0.{index + 1}"


class Cluster:
    """Members named n0, n1, ... at 10.0.0.1, 10.0.0.2, ...; every event recorded per member."""

    def __init__(self, network: InMemoryNetwork) -> None:
        self.network = network
        self.nodes: dict[str, Membership] = {}
        self.events: dict[str, list[MemberEvent]] = {}

    async def add(
        self,
        index: int,
        *,
        seed: int | None = 0,
        timeouts: Timeouts = FAST,
        node_id: str | None = None,
        address: str | None = None,
    ) -> Membership:
        name = node_id or f"n{index}"
        address = address or host(index)
        endpoint = self.network.endpoint(address, PORT, cluster="lab")
        member = Membership(
            name,
            address,
            PORT,
            {"role": "training", "index": index},
            endpoint,
            timeouts,
            cluster="lab",
            rng=random.Random(index),
        )
        key = name if name not in self.nodes else f"{name}@{address}"
        self.events[key] = []
        member.add_listener(self.events[key].append)
        await member.start()
        self.nodes[key] = member
        if seed is not None and seed != index:
            member.add_candidate(host(seed), PORT)
        return member

    async def grow(self, count: int, **kwargs: object) -> list[Membership]:
        return [await self.add(index, **kwargs) for index in range(count)]  # type: ignore[arg-type]

    async def crash(self, name: str) -> None:
        member = self.nodes.pop(name)
        self.network.isolate(member.member(member.self_id).address)  # type: ignore[union-attr]
        await member.close()

    def state(self, observer: str, node_id: str) -> MemberState | None:
        view = self.nodes[observer].member(node_id)
        return None if view is None else view.state

    def all_see(self, node_id: str, state: MemberState, observers: Iterable[str] = ()) -> bool:
        names = list(observers) or [name for name in self.nodes if name != node_id]
        return all(self.state(name, node_id) == state for name in names)

    def all_alive(self) -> bool:
        size = len(self.nodes)
        return all(node.counts()["alive"] == size for node in self.nodes.values())

    def seen(self, observer: str, node_id: str, kinds: set[EventKind]) -> list[MemberEvent]:
        return [e for e in self.events[observer] if e.member.node_id == node_id and e.kind in kinds]

    async def close(self) -> None:
        for member in self.nodes.values():
            await member.close()


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or condition}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running_cluster() -> AsyncIterator[Cluster]:
    """A cluster on a network of 0.5-1 ms delays, closed with every member on exit."""
    network = InMemoryNetwork(random.Random(7), delay_s=0.0005, jitter_s=0.0005)
    built = Cluster(network)
    try:
        yield built
    finally:
        await built.close()
        network.close()


FAILED = {EventKind.SUSPECT, EventKind.DEAD}


def in_indirect_probe(node: Membership, target: str) -> bool:
    waits = node._acks._waits.values()  # test peeks at the probe in flight to time the stall
    return any(isinstance(w, ProbeWait) and w.target == target and w.relays for w in waits)
