"""The seams of the elector: durable state and transport, as protocols; the WAL adapter; and
in-memory implementations with fault injection (drop, delay, one-way and two-way partitions)
for tests and single-process dev clusters.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from node.election.messages import Heartbeat, HeartbeatAck, VoteReply, VoteRequest
from node.election.roles import NodeCapabilities
from node.plan import PlanFence, RestartRequest, RolePlan

CapabilitiesSource = Callable[[], Sequence[NodeCapabilities]]
DrainSource = Callable[[int], Mapping[str, float | None] | None]
"""The drained nodes (node id -> kill_after_s) a coordinator of the given term has read from
their durable store, or None while it has not read them yet (the plan keeps its previous
plan's)."""
QuarantineSource = Callable[[int], Mapping[str, str] | None]  # as DrainSource: node -> reason
RestartSource = Callable[[], RestartRequest | None]
"""The restart of the training group a coordinator is asked for (node.training), or None."""


class DurableState(Protocol):
    """Small durable key/value state; `set` returns only once the value is on disk."""

    async def get(self, key: str) -> Any: ...
    async def set(self, key: str, value: Any) -> None: ...


class ElectionTransport(Protocol):
    """Request/reply to one peer; None when it did not answer (timeout, refused, breaker open)."""

    async def request_vote(self, to: str, request: VoteRequest) -> VoteReply | None: ...
    async def send_heartbeat(self, to: str, heartbeat: Heartbeat) -> HeartbeatAck | None: ...


class ElectionEndpoint(Protocol):
    """The receiving side: what the HTTP handlers (or the in-memory network) call."""

    async def handle_vote_request(self, request: VoteRequest) -> VoteReply: ...
    async def handle_heartbeat(self, heartbeat: Heartbeat) -> HeartbeatAck: ...
    async def plan_at(self, fence: PlanFence, wait_s: float) -> RolePlan | None: ...


class StateStore(Protocol):
    """What the WAL offers for small durable state (`wal.WriteAheadLog`)."""

    async def state_get(self, key: str, default: Any = None) -> Any: ...
    async def state_set(self, key: str, value: Any) -> None: ...


class WalDurableState:
    """DurableState over the WAL's state table (synchronous=FULL: durable when `set` returns)."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    async def get(self, key: str) -> Any:
        return await self._store.state_get(key, None)

    async def set(self, key: str, value: Any) -> None:
        await self._store.state_set(key, value)


class InMemoryDurableState:
    """DurableState in a dict that outlives the elector using it (a restart keeps it).

    Values round-trip through JSON like the WAL's; `write_delay_s` stands in for fsync.
    """

    def __init__(self, write_delay_s: float = 0.0) -> None:
        self.values: dict[str, str] = {}
        self.writes = 0
        self.write_delay_s = write_delay_s

    async def get(self, key: str) -> Any:
        text = self.values.get(key)
        return None if text is None else json.loads(text)

    async def set(self, key: str, value: Any) -> None:
        text = json.dumps(value)
        if self.write_delay_s > 0:
            await asyncio.sleep(self.write_delay_s)
        self.values[key] = text
        self.writes += 1


class InMemoryElectionNetwork:
    """Nodes in one process. Each leg of a request/reply may be dropped (`drop_rate`), delayed
    (`delay_s` range), or cut: `block(a, b)` cuts a -> b only; `partition` cuts between groups.
    A lost leg makes the request answer None, as a timed-out HTTP request would."""

    def __init__(
        self,
        rng: random.Random | None = None,
        drop_rate: float = 0.0,
        delay_s: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.rng = rng or random.Random(0)
        self.drop_rate = drop_rate
        self.delay_s = delay_s
        self._endpoints: dict[str, ElectionEndpoint] = {}
        self._blocked: set[tuple[str, str]] = set()
        self.delivered = 0
        self.lost = 0
        self.whole_plans_sent = 0
        """Heartbeats that carried a whole plan."""
        self.plans_fetched = 0
        """Plans fetched from a member (node.election.pull)."""

    def register(self, node_id: str, endpoint: ElectionEndpoint) -> None:
        self._endpoints[node_id] = endpoint

    def unregister(self, node_id: str) -> None:
        """The node is down: requests to it get no answer."""
        self._endpoints.pop(node_id, None)

    def transport(self, node_id: str) -> InMemoryElectionTransport:
        return InMemoryElectionTransport(self, node_id)

    def block(self, source: str, target: str) -> None:
        """Lose every message from `source` to `target` (one way)."""
        self._blocked.add((source, target))

    def unblock(self, source: str, target: str) -> None:
        self._blocked.discard((source, target))

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut both ways between nodes of different groups (replacing earlier cuts)."""
        sets = [set(group) for group in groups]
        self._blocked = {
            (a, b)
            for i, first in enumerate(sets)
            for j, second in enumerate(sets)
            if i != j
            for a in first
            for b in second
        }

    def heal(self) -> None:
        self._blocked.clear()

    async def _leg(self, source: str, target: str) -> bool:
        low, high = self.delay_s
        if high > 0:
            await asyncio.sleep(self.rng.uniform(low, high))
        lost = (source, target) in self._blocked or self.rng.random() < self.drop_rate
        if lost:
            self.lost += 1
        return not lost

    async def call_vote(self, source: str, target: str, request: VoteRequest) -> VoteReply | None:
        endpoint = self._endpoints.get(target)
        if endpoint is None or not await self._leg(source, target):
            return None
        try:
            reply = await endpoint.handle_vote_request(request)
        except Exception:  # the peer's handler failed: an HTTP 5xx, no answer
            return None
        return reply if await self._leg(target, source) else None

    async def call_heartbeat(
        self, source: str, target: str, heartbeat: Heartbeat
    ) -> HeartbeatAck | None:
        endpoint = self._endpoints.get(target)
        if endpoint is None or not await self._leg(source, target):
            return None
        try:
            ack = await endpoint.handle_heartbeat(heartbeat)
        except Exception:  # the peer's handler failed: an HTTP 5xx, no answer
            return None
        if not await self._leg(target, source):
            return None
        self.delivered += 1
        return ack

    async def call_plan(
        self, source: str, target: str, fence: PlanFence, wait_s: float
    ) -> RolePlan | None:
        endpoint = self._endpoints.get(target)
        if endpoint is None or not await self._leg(source, target):
            return None
        plan = await endpoint.plan_at(fence, wait_s)
        if plan is None or not await self._leg(target, source):
            return None
        self.plans_fetched += 1
        return plan


class InMemoryElectionTransport:
    """One node's ElectionTransport on an InMemoryElectionNetwork."""

    def __init__(self, network: InMemoryElectionNetwork, node_id: str) -> None:
        self._network = network
        self.node_id = node_id

    async def request_vote(self, to: str, request: VoteRequest) -> VoteReply | None:
        return await self._network.call_vote(self.node_id, to, request)

    async def send_heartbeat(self, to: str, heartbeat: Heartbeat) -> HeartbeatAck | None:
        if heartbeat.plan is not None:
            self._network.whole_plans_sent += 1
        return await self._network.call_heartbeat(self.node_id, to, heartbeat)

    async def fetch_plan(self, to: str, fence: PlanFence, wait_s: float) -> RolePlan | None:
        return await self._network.call_plan(self.node_id, to, fence, wait_s)
