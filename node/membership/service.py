"""SWIM membership with Lifeguard suspicion: the failure detector of the node daemon.

`Membership` probes one member per period, spreads updates piggybacked on its messages and by
eager gossip, syncs full views by push-pull, and keeps the view the daemon's API shows.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from config.closing import AsyncClosing
from config.timeouts import Timeouts
from node.errors import MembershipError
from node.membership.events import Listener
from node.membership.protocol import Phase, SwimProtocol
from node.membership.table import UP
from node.membership.transport import InMemoryNetwork, MembershipTransport, TransportStats
from node.membership.types import (
    EventKind,
    Member,
    MemberEvent,
    MemberState,
    MemberView,
    MetaValue,
    Refusal,
    SwimTuning,
    Update,
    freeze_meta,
    validate_node_id,
    validate_port,
)
from node.membership.udp import UdpMembershipTransport
from node.membership.wire import Message, MessageKind, encode_update

__all__ = [
    "EventKind",
    "InMemoryNetwork",
    "Listener",
    "Member",
    "MemberEvent",
    "MemberState",
    "MemberView",
    "Membership",
    "MembershipTransport",
    "MetaValue",
    "SwimTuning",
    "TransportStats",
    "UdpMembershipTransport",
]

log = logging.getLogger(__name__)


class Membership(SwimProtocol, AsyncClosing):
    """This node's membership: owns the probe task, its timers and (from start) the transport.

    `async with Membership(...)` starts it; `close()` is idempotent and irreversible; `leave()`
    announces a graceful departure first. Timing comes from `timeouts` (probe_interval_s,
    probe_timeout_s, indirect_probe_timeout_s, suspicion_s, dead_reap_s); `clock` is monotonic
    seconds, timers run on the event loop.
    """

    def __init__(
        self,
        self_id: str,
        address: str,
        port: int,
        meta: Mapping[str, MetaValue],
        transport: MembershipTransport,
        timeouts: Timeouts,
        *,
        cluster: str = "lab",
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        k_indirect: int | None = None,
        tuning: SwimTuning | None = None,
    ) -> None:
        if transport.cluster != cluster:
            raise MembershipError(
                f"transport is for cluster {transport.cluster!r}, not {cluster!r}"
            )
        tuning = tuning or SwimTuning()
        if k_indirect is not None:
            tuning = replace(tuning, k_indirect=k_indirect)
        me = Member(
            validate_node_id(self_id),
            address,
            validate_port(port),
            MemberState.ALIVE,
            0,
            freeze_meta(meta),
            clock(),
        )
        super().__init__(me, transport, timeouts, tuning, rng or random.Random(), clock)
        self._probe_task: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def _enter(self) -> None:
        await self.start()

    async def start(self) -> None:
        """Start the transport, announce ourselves and run the probe loop."""
        if self._phase is not Phase.NEW:
            raise MembershipError("a membership starts once; create a new one after close()")
        await self._transport.start(self._on_datagram)
        self._phase = Phase.RUNNING
        self._next_sync_at = self._clock() + self._sync_interval_s() * self._rng.uniform(0.5, 1)
        self._queue_update(self._self_update())
        for endpoint in list(self._candidates):
            self._ping_candidate(endpoint)
        self._probe_task = asyncio.get_running_loop().create_task(
            self._probe_loop(), name=f"membership-probe-{self.self_id}"
        )

    async def leave(self, timeout_s: float = 1.0) -> None:
        """Announce `left` directly to several members (and by gossip), wait up to timeout_s
        for their acks, stop probing. Members mark us left at once. Call close() afterwards."""
        if self._phase is not Phase.RUNNING:
            return
        self._phase = Phase.LEAVING
        await self._stop_probing()
        self._table.me = replace(self._table.me, state=MemberState.LEFT, state_since=self._clock())
        left = self._self_update()
        self._queue_update(left)
        waits = []
        for peer in self._table.pick(self._tuning.leave_fanout, UP):
            seq, wait = self._acks.expect(peer.node_id)
            waits.append((seq, wait.future))
            ping = Message(MessageKind.PING, self.self_id, seq, target=peer.node_id)
            self._send(ping, peer.endpoint, [left])
        acked = 0
        try:
            if waits:
                await asyncio.wait([future for _, future in waits], timeout=timeout_s)
        finally:
            acked = sum(1 for _, future in waits if future.done() and not future.cancelled())
            for seq, _ in waits:
                self._acks.forget(seq)
        log.info("%s: left the cluster; %d of %d members acked", self.self_id, acked, len(waits))

    async def close(self) -> None:
        """Stop probing, cancel every timer, close the transport. Idempotent."""
        if self._phase is Phase.CLOSED:
            return
        self._phase = Phase.CLOSED
        try:
            await self._stop_probing()
        finally:
            if self._gossip_handle is not None:
                self._gossip_handle.cancel()
                self._gossip_handle = None
            self._acks.close()
            self._suspicions.close()
            await self._transport.close()

    async def _stop_probing(self) -> None:
        task, self._probe_task = self._probe_task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    # --- the daemon's API --------------------------------------------------------------------

    @property
    def incarnation(self) -> int:
        return self._table.me.incarnation

    @property
    def local_health(self) -> int:
        """Lifeguard's local health score: 0 is healthy; probe timeouts scale by (score + 1)."""
        return self._health

    @property
    def stall_count(self) -> int:
        """Recent stalls of our own event loop (timers that fired too late)."""
        return len(self._stalls)

    def event_counts(self) -> dict[str, int]:
        """Changes of the view since start, by event kind (joined, suspect, dead, alive, ...)."""
        return {kind.value: count for kind, count in self._events.counts.items()}

    def transport_stats(self) -> TransportStats:
        return self._transport.stats()

    def add_candidate(self, address: str, port: int) -> None:
        """Probe (address, port), a possible member found by discovery; its answer adds it and
        starts a push-pull sync. `address` must be an IP literal. Cheap to call repeatedly."""
        try:
            ipaddress.ip_address(address)
        except ValueError as exc:
            raise MembershipError(f"candidate address {address!r} is not an IP address") from exc
        endpoint = (address, validate_port(port))
        if endpoint == self._table.me.endpoint:
            return
        known = self._table.at(endpoint)
        if known is not None and known.state in UP:
            return
        fresh = endpoint not in self._candidates
        self._candidates[endpoint] = self._tuning.candidate_attempts
        if fresh and self._phase is Phase.RUNNING:
            self._ping_candidate(endpoint)

    def update_meta(self, changes: Mapping[str, MetaValue]) -> None:
        """Merge `changes` into what we advertise; a new incarnation spreads it by gossip."""
        me = self._table.me
        meta = freeze_meta({**me.meta, **changes})
        if len(encode_update(replace(self._self_update(), meta=meta))) > 600:
            raise MembershipError("meta is too large to gossip; keep it under 600 bytes of JSON")
        self._table.me = replace(me, meta=meta, incarnation=me.incarnation + 1)
        self._queue_update(self._self_update())
        self._emit(EventKind.UPDATED, self._table.me, me.state)

    def refuse(self, node_id: str, reason: str, mark: tuple[str, str] | None = None) -> None:
        """Stop hearing `node_id` (its certificate was revoked, say): declare it dead, drop its
        datagrams and ignore news of it alive until `allow`, or until it advertises a meta
        value other than `mark` (key, value) (a new certificate). Itself is never refused."""
        if node_id == self._id:
            return
        refusal = Refusal(reason, mark)
        if self._table.refused.get(node_id) != refusal:
            log.warning("%s: refusing %s: %s", self._id, node_id, reason)
        self._table.refused[node_id] = refusal
        current = self._table.get(node_id)
        if current is not None and current.state in UP:
            self._merge(Update(node_id, MemberState.DEAD, current.incarnation, by=self._id))

    def allow(self, node_id: str) -> None:
        """Hear `node_id` again (after `refuse`); it comes back when it next refutes."""
        if self._table.refused.pop(node_id, None) is not None:
            log.warning("%s: no longer refusing %s", self._id, node_id)

    def refusals(self) -> dict[str, str]:
        """The members this node refuses, with why."""
        return {node_id: refusal.reason for node_id, refusal in self._table.refused.items()}

    def preload(self, members: Iterable[Member]) -> None:
        """Know `members` before start, as if learned by push-pull (a warm start)."""
        if self._phase is not Phase.NEW:
            raise MembershipError("preload() only before start()")
        self._table.preload(members)

    def members(self) -> list[MemberView]:
        """Every member this node knows, itself first (is_self=True), then by node id."""
        return self._table.views(self._clock())

    def member(self, node_id: str) -> MemberView | None:
        me = self._table.me
        found = me if node_id == me.node_id else self._table.get(node_id)
        return None if found is None else self._table.view(found, self._clock())

    def counts(self) -> dict[str, int]:
        """Members per state (alive, suspect, dead, left), this node included."""
        counted = Counter(member.state for member in self._table)
        counted[self._table.me.state] += 1
        return {state.value: counted[state] for state in MemberState}

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(event)` on every change of the view; returns its remover."""
        return self._events.add(listener)
