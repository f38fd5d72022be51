"""SWIM membership with Lifeguard suspicion: the failure detector of the node daemon.

`Membership` probes one member per period, spreads updates piggybacked on its messages and by
eager gossip, syncs full views by push-pull, and keeps the view the daemon's API shows.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import replace
from itertools import chain

from config.timeouts import Timeouts
from node.errors import MembershipError
from node.membership_rules import (
    MergeOutcome,
    ProbeResult,
    Suspicion,
    apply_health,
    expected_confirmations,
    from_sync,
    health_delta,
    is_confirmation,
    merge_remote,
    merge_self,
    overlaps_stall,
    reap_due,
    retransmit_limit,
    scaled_s,
    stall_threshold_s,
    suspicion_bounds_s,
    sync_interval_s,
    view_digest,
)
from node.membership_types import (
    EMPTY_META,
    Address,
    EventKind,
    Member,
    MemberEvent,
    MemberState,
    MemberView,
    MetaValue,
    SwimTuning,
    Update,
    freeze_meta,
    validate_node_id,
    validate_port,
)
from node.swim_gossip import GossipQueue
from node.swim_timers import AckTable, RelayWait, SuspicionTimers
from node.swim_transport import InMemoryNetwork, MembershipTransport, TransportStats
from node.swim_udp import UdpMembershipTransport
from node.swim_wire import (
    Message,
    MessageKind,
    WireError,
    assemble,
    decode_message,
    encode_header,
    encode_update,
    member_record,
    state_chunks,
)

__all__ = [
    "InMemoryNetwork",
    "Listener",
    "Membership",
    "MembershipTransport",
    "UdpMembershipTransport",
]

log = logging.getLogger(__name__)

Listener = Callable[[MemberEvent], None]
_UP = (MemberState.ALIVE, MemberState.SUSPECT)
_ALIVE = (MemberState.ALIVE,)
_WARN_AGAIN_S = 600.0


class _Phase(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    LEAVING = "leaving"
    CLOSED = "closed"


class Membership:
    """This node's membership: owns the probe task, the timers and (from start) the transport.

    `async with Membership(...)` starts it; `close()` is idempotent and irreversible. `leave()`
    announces a graceful departure first. Listeners are called on the event loop, synchronously.
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
        self._tuning = tuning or SwimTuning()
        if k_indirect is not None:
            self._tuning = replace(self._tuning, k_indirect=k_indirect)
        self._timeouts = timeouts
        self._transport = transport
        self._rng = rng or random.Random()
        self._clock = clock
        self._self = Member(
            validate_node_id(self_id),
            address,
            validate_port(port),
            MemberState.ALIVE,
            0,
            freeze_meta(meta),
            clock(),
        )
        self._members: dict[str, Member] = {}
        self._ids: list[str] = []
        self._id_index: dict[str, int] = {}
        self._by_endpoint: dict[Address, str] = {}
        self._heard_at: dict[str, float] = {}
        self._down_since: dict[str, float] = {}
        self._synced_at: dict[str, float] = {}
        self._queue = GossipQueue()
        self._acks = AckTable(self._rng)
        self._suspicions = SuspicionTimers(clock, self._suspicion_expired)
        self._probe_order: list[str] = []
        self._probe_index = 0
        self._reprobe: str | None = None
        self._candidates: dict[Address, int] = {}
        self._stalls: deque[tuple[float, float]] = deque(maxlen=32)
        self._stall_threshold_s = stall_threshold_s(
            timeouts.probe_timeout_s, self._tuning.stall_threshold_min_s
        )
        self._stall_warned_at = -math.inf
        self._health = 0
        self._refuted: dict[Address, int] = {}
        self._conflict_refuted_at: dict[Address, float] = {}
        self._conflicts: set[tuple[str, Address]] = set()
        self._warned_at: dict[str, float] = {}
        self._listeners: list[Listener] = []
        self._gossip_handle: asyncio.Handle | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._phase = _Phase.NEW
        self._version = 0
        self._digest: tuple[int, str] = (-1, "")
        self._next_sync_at = 0.0
        self.last_error: str | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Membership:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the transport, announce ourselves and run the probe loop."""
        if self._phase is not _Phase.NEW:
            raise MembershipError("a membership starts once; create a new one after close()")
        await self._transport.start(self._on_datagram)
        self._phase = _Phase.RUNNING
        now = self._clock()
        self._next_sync_at = now + self._sync_interval_s() * self._rng.uniform(0.5, 1.0)
        self._queue_update(self._self_update())
        for address in list(self._candidates):
            self._ping_candidate(address)
        self._probe_task = asyncio.get_running_loop().create_task(
            self._probe_loop(), name=f"membership-probe-{self.self_id}"
        )

    async def leave(self, timeout_s: float = 1.0) -> None:
        """Announce `left` to several members at once and wait up to timeout_s for their acks;
        then stop probing. Call close() afterwards."""
        if self._phase is not _Phase.RUNNING:
            return
        self._phase = _Phase.LEAVING
        await self._stop_probing()
        self._self = replace(self._self, state=MemberState.LEFT, state_since=self._clock())
        self._version += 1
        left = self._self_update()
        self._queue_update(left)
        waits = []
        for peer in self._pick(self._tuning.leave_fanout, _UP):
            seq, wait = self._acks.expect(peer.node_id)
            waits.append((seq, wait.future))
            self._send(
                Message(MessageKind.PING, self.self_id, seq, target=peer.node_id),
                peer.endpoint,
                [left],
            )
        try:
            if waits:
                await asyncio.wait([future for _, future in waits], timeout=timeout_s)
        finally:
            acked = sum(1 for _, future in waits if future.done() and not future.cancelled())
            for seq, _ in waits:
                self._acks.forget(seq)
        log.info(
            "%s: left the cluster; %d of %d members acknowledged", self.self_id, acked, len(waits)
        )

    async def close(self) -> None:
        """Stop probing, cancel every timer, close the transport. Idempotent."""
        if self._phase is _Phase.CLOSED:
            return
        self._phase = _Phase.CLOSED
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
    def self_id(self) -> str:
        return self._self.node_id

    @property
    def incarnation(self) -> int:
        return self._self.incarnation

    @property
    def local_health(self) -> int:
        """Lifeguard's local health score: 0 is healthy; timeouts scale by (score + 1)."""
        return self._health

    @property
    def stall_count(self) -> int:
        """Stalls of our own event loop seen lately (timers that fired too late)."""
        return len(self._stalls)

    def transport_stats(self) -> TransportStats:
        return self._transport.stats()

    def add_candidate(self, address: str, port: int) -> None:
        """Probe (address, port), a possible member found by discovery; an answer adds it.
        `address` must be an IP literal."""
        try:
            ipaddress.ip_address(address)
        except ValueError as exc:
            raise MembershipError(f"candidate address {address!r} is not an IP address") from exc
        endpoint = (address, validate_port(port))
        if endpoint == self._self.endpoint:
            return
        known = self._by_endpoint.get(endpoint)
        if known is not None and self._members[known].state in _UP:
            return
        fresh = endpoint not in self._candidates
        self._candidates[endpoint] = self._tuning.candidate_attempts
        if fresh and self._phase is _Phase.RUNNING:
            self._ping_candidate(endpoint)

    def update_meta(self, changes: Mapping[str, MetaValue]) -> None:
        """Merge `changes` into what we advertise; the new incarnation spreads by gossip."""
        meta = freeze_meta({**self._self.meta, **changes})
        if (
            len(encode_update(replace(self._self_update(), meta=meta)))
            > self._transport.body_budget // 2
        ):
            raise MembershipError("meta is too large to gossip; keep it under ~600 bytes of JSON")
        previous = self._self.state
        self._self = replace(self._self, meta=meta, incarnation=self._self.incarnation + 1)
        self._version += 1
        self._queue_update(self._self_update())
        self._emit(EventKind.UPDATED, self._self, previous)

    def preload(self, members: Iterable[Member]) -> None:
        """Know `members` before start, as if learned by push-pull (a warm start)."""
        if self._phase is not _Phase.NEW:
            raise MembershipError("preload() only before start()")
        for member in members:
            if member.node_id != self.self_id and member.node_id not in self._members:
                self._store(None, member)

    def members(self) -> list[MemberView]:
        """Every member this node knows, itself first (is_self=True)."""
        now = self._clock()
        others = sorted(self._members.values(), key=lambda m: m.node_id)
        return [self._view(member, now) for member in chain([self._self], others)]

    def member(self, node_id: str) -> MemberView | None:
        found = self._self if node_id == self.self_id else self._members.get(node_id)
        return None if found is None else self._view(found, self._clock())

    def counts(self) -> dict[str, int]:
        """Members per state, this node included."""
        counted = Counter(m.state for m in chain([self._self], self._members.values()))
        return {state.value: counted[state] for state in MemberState}

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` on every event; returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # --- view bookkeeping --------------------------------------------------------------------

    def _view(self, member: Member, now: float) -> MemberView:
        is_self = member.node_id == self.self_id
        heard = now if is_self else self._heard_at.get(member.node_id, member.state_since)
        return MemberView(
            member.node_id,
            member.address,
            member.port,
            member.state,
            member.incarnation,
            max(0.0, now - heard),
            member.meta,
            is_self,
            member.conflict,
        )

    def _store(self, previous: Member | None, member: Member) -> None:
        node_id = member.node_id
        self._members[node_id] = member
        self._version += 1
        if previous is None:
            self._id_index[node_id] = len(self._ids)
            self._ids.append(node_id)
            if self._probe_index < len(self._probe_order):
                spot = self._rng.randint(self._probe_index, len(self._probe_order))
                self._probe_order.insert(spot, node_id)
        elif (
            previous.endpoint != member.endpoint
            and self._by_endpoint.get(previous.endpoint) == node_id
        ):
            del self._by_endpoint[previous.endpoint]
        self._by_endpoint[member.endpoint] = node_id
        if member.state in _UP:
            self._down_since.pop(node_id, None)
        elif previous is None or previous.state != member.state:
            self._down_since[node_id] = member.state_since

    def _reap(self, node_id: str) -> None:
        member = self._members.pop(node_id)
        self._version += 1
        index = self._id_index.pop(node_id)
        last = self._ids.pop()
        if last != node_id:
            self._ids[index] = last
            self._id_index[last] = index
        if self._by_endpoint.get(member.endpoint) == node_id:
            del self._by_endpoint[member.endpoint]
        for table in (self._heard_at, self._down_since, self._synced_at, self._warned_at):
            table.pop(node_id, None)
        self._queue.discard(node_id)
        self._suspicions.cancel(node_id)
        self._emit(EventKind.REAPED, member, member.state)

    def _pick(
        self, count: int, states: Container[MemberState], exclude: Container[str] = ()
    ) -> list[Member]:
        """Up to `count` random distinct members in `states`, in O(count) for large views."""
        ids = self._ids
        if count <= 0 or not ids:
            return []
        if len(ids) <= 4 * count + 16:
            pool = [m for i in ids if i not in exclude and (m := self._members[i]).state in states]
            return self._rng.sample(pool, min(count, len(pool)))
        picked: dict[str, Member] = {}
        for _ in range(count * 8):
            node_id = ids[self._rng.randrange(len(ids))]
            member = self._members[node_id]
            if node_id not in exclude and node_id not in picked and member.state in states:
                picked[node_id] = member
                if len(picked) >= count:
                    break
        return list(picked.values())

    def _digest_now(self) -> str:
        if self._digest[0] != self._version:
            members = chain([self._self], self._members.values())
            self._digest = (self._version, view_digest(members))
        return self._digest[1]

    def _sync_interval_s(self) -> float:
        every = self._tuning.sync_every_probes
        return sync_interval_s(self._timeouts.probe_interval_s, every, len(self._members) + 1)

    # --- events and logs ---------------------------------------------------------------------

    def _emit(
        self,
        kind: EventKind,
        member: Member,
        previous: MemberState | None,
        conflict_with: Address | None = None,
    ) -> None:
        self._log_event(kind, member)
        if not self._listeners:
            return
        event = MemberEvent(kind, self._view(member, self._clock()), previous, conflict_with)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("%s: membership listener failed on %s", self.self_id, kind)

    def _log_event(self, kind: EventKind, member: Member) -> None:
        node_id = member.node_id
        if kind in (EventKind.SUSPECT, EventKind.DEAD):
            now = self._clock()
            repeated = now - self._warned_at.get(node_id, -math.inf) < _WARN_AGAIN_S
            if kind == EventKind.DEAD and not repeated:
                self._warned_at[node_id] = now
            level = logging.INFO if kind == EventKind.SUSPECT else logging.WARNING
            log.log(
                logging.DEBUG if repeated else level,
                "%s: member %s (%s:%s) is %s",
                self.self_id,
                node_id,
                member.address,
                member.port,
                kind,
            )
        elif kind in (EventKind.JOINED, EventKind.ALIVE, EventKind.LEFT):
            log.info(
                "%s: member %s (%s:%s) %s, incarnation %d",
                self.self_id,
                node_id,
                member.address,
                member.port,
                kind,
                member.incarnation,
            )
        elif kind != EventKind.CONFLICT:
            log.debug("%s: member %s %s", self.self_id, node_id, kind)

    def _report_conflict(self, member: Member, other: Address) -> None:
        key = (member.node_id, other)
        if key in self._conflicts:
            return
        self._conflicts.add(key)
        if member.node_id == self.self_id:
            self._self = replace(self._self, conflict=other)
            member = self._self
        log.error(
            "%s: node id %s is claimed by two live nodes, %s:%s and %s:%s; give every host its "
            "own node id",
            self.self_id,
            member.node_id,
            member.address,
            member.port,
            *other,
        )
        self._emit(EventKind.CONFLICT, member, member.state, conflict_with=other)

    # --- merging updates -----------------------------------------------------------------------

    def _self_update(self) -> Update:
        me = self._self
        if me.state == MemberState.LEFT:
            return Update(me.node_id, MemberState.LEFT, me.incarnation, me.address, me.port)
        return Update(me.node_id, MemberState.ALIVE, me.incarnation, me.address, me.port, me.meta)

    def _as_update(self, member: Member, by: str | None) -> Update:
        if member.state == MemberState.ALIVE:
            return Update(
                member.node_id,
                member.state,
                member.incarnation,
                member.address,
                member.port,
                member.meta,
            )
        if member.state == MemberState.LEFT:
            return Update(member.node_id, member.state, member.incarnation)
        return Update(member.node_id, member.state, member.incarnation, by=by or self.self_id)

    def _merge(self, update: Update, *, sync_from: str | None = None) -> None:
        if update.node_id == self.self_id:
            self._merge_self(update)
            return
        current = self._members.get(update.node_id)
        if sync_from is not None:
            if current is None and update.state not in _UP:
                return
            update = from_sync(update, sync_from)
        if is_confirmation(current, update, self.self_id):
            assert update.by is not None
            if self._suspicions.confirm(update.node_id, update.by):
                self._queue_update(update)
            return
        outcome = merge_remote(current, update, self._clock(), from_sync=sync_from is not None)
        if outcome.member is not None:
            self._apply(current, outcome, update.by)

    def _apply(self, current: Member | None, outcome: MergeOutcome, by: str | None) -> None:
        member = outcome.member
        assert member is not None
        self._store(current, member)
        if member.state == MemberState.SUSPECT:
            if (
                current is None
                or current.state != member.state
                or current.incarnation != member.incarnation
            ):
                self._start_suspicion(member, by or self.self_id)
        else:
            self._suspicions.cancel(member.node_id)
        if outcome.gossip:
            self._queue_update(self._as_update(member, by))
        if outcome.event is not None:
            self._emit(outcome.event, member, None if current is None else current.state)
        if outcome.conflict is not None:
            self._report_conflict(member, outcome.conflict)

    def _merge_self(self, update: Update) -> None:
        leaving = self._phase is not _Phase.RUNNING
        outcome = merge_self(self._self, update, leaving=leaving, refuted=self._refuted)
        if outcome.refute_to is None:
            return
        now = self._clock()
        foreign = outcome.foreign
        if foreign is not None:
            in_conflict = (self.self_id, foreign) in self._conflicts
            if outcome.conflict:
                self._report_conflict(self._self, foreign)
            if in_conflict:
                every = self._timeouts.probe_interval_s * self._tuning.conflict_refute_every_probes
                if now - self._conflict_refuted_at.get(foreign, -math.inf) < every:
                    return
                self._conflict_refuted_at[foreign] = now
            self._refuted[foreign] = outcome.refute_to
        if outcome.suspected:
            self._health = apply_health(self._health, 1, self._tuning.max_health_score)
        log.debug(
            "%s: refuting %s at incarnation %d with %d",
            self.self_id,
            update.state,
            update.incarnation,
            outcome.refute_to,
        )
        self._self = replace(self._self, incarnation=outcome.refute_to)
        self._version += 1
        self._queue_update(self._self_update())

    def _start_suspicion(self, member: Member, origin: str) -> None:
        size = len(self._members) + 1
        low, high = suspicion_bounds_s(
            self._timeouts.suspicion_s, size, self._tuning.suspicion_max_mult
        )
        expected = expected_confirmations(self._tuning.k_indirect, size)
        self._suspicions.start(
            Suspicion(
                member.node_id,
                member.incarnation,
                self._clock(),
                origin,
                frozenset(),
                expected,
                low,
                high,
            )
        )

    def _suspicion_expired(self, suspicion: Suspicion, due: float, checked_from: float) -> None:
        self._note_wake(due)
        member = self._members.get(suspicion.node_id)
        if (
            self._phase is not _Phase.RUNNING
            or member is None
            or member.state != MemberState.SUSPECT
            or member.incarnation != suspicion.incarnation
        ):
            return
        now = self._clock()
        if overlaps_stall(self._stalls, checked_from, now):
            grace = scaled_s(self._timeouts.probe_interval_s, self._health)
            self._suspicions.extend(suspicion, grace, now)
            return
        self._merge(
            Update(suspicion.node_id, MemberState.DEAD, suspicion.incarnation, by=self.self_id)
        )

    # --- sending -------------------------------------------------------------------------------

    def _send(
        self,
        message: Message,
        address: Address,
        extra: Sequence[Update] = (),
        *,
        only_with_updates: bool = False,
    ) -> bool:
        """Send `message` with `extra` updates first, then as many queued ones as fit."""
        header = encode_header(message)
        blobs = [encode_update(update) for update in extra]
        room = self._transport.body_budget - len(header) - 6 - sum(len(b) + 1 for b in blobs)
        limit = retransmit_limit(self._tuning.retransmit_mult, len(self._members) + 1)
        count = self._tuning.max_piggyback - len(blobs)
        exclude = {update.node_id for update in extra}
        blobs += self._queue.take(room, count, limit, exclude)
        if only_with_updates and not blobs:
            return False
        self._transport.send(assemble(header, blobs), address)
        return True

    def _queue_update(self, update: Update) -> None:
        self._queue.push(update.node_id, encode_update(update))
        self._arm_gossip(None)

    def _arm_gossip(self, delay_s: float | None) -> None:
        if self._gossip_handle is not None or self._phase not in (_Phase.RUNNING, _Phase.LEAVING):
            return
        loop = asyncio.get_running_loop()
        if delay_s is None:
            self._gossip_handle = loop.call_soon(self._gossip_tick)
        else:
            self._gossip_handle = loop.call_later(delay_s, self._gossip_tick)

    def _gossip_tick(self) -> None:
        """Eager gossip: send fresh updates to a few random members, again while any remain."""
        self._gossip_handle = None
        sent = False
        for peer in self._pick(self._tuning.gossip_fanout, _UP):
            message = Message(MessageKind.GOSSIP, self.self_id, 0)
            sent = self._send(message, peer.endpoint, only_with_updates=True) or sent
        if sent and len(self._queue):
            self._arm_gossip(self._timeouts.probe_interval_s * self._tuning.gossip_interval_mult)

    def _start_sync(self, member: Member, now: float, *, force: bool = False) -> None:
        """Push-pull: offer our view's digest; a peer whose view differs sends its own back."""
        if (
            not force
            and now - self._synced_at.get(member.node_id, -math.inf) < self._sync_interval_s()
        ):
            return
        self._synced_at[member.node_id] = now
        seq = self._acks.next_seq()
        message = Message(MessageKind.SYNC, self.self_id, seq, digest=self._digest_now())
        self._transport.send(encode_header(message), member.endpoint)

    def _send_state(self, address: Address, *, reply: bool) -> None:
        records = chain([self._self], self._members.values())
        blobs = [encode_update(member_record(member)) for member in records]
        seq = self._acks.next_seq()
        for body in state_chunks(self.self_id, seq, reply, blobs, self._transport.body_budget):
            self._transport.send(body, address)

    def _ping_candidate(self, endpoint: Address) -> None:
        attempts = self._candidates.get(endpoint, 0) - 1
        if attempts <= 0:
            self._candidates.pop(endpoint, None)
        else:
            self._candidates[endpoint] = attempts
        message = Message(MessageKind.PING, self.self_id, self._acks.next_seq(), target=None)
        self._send(message, endpoint, [self._self_update()])

    # --- receiving -----------------------------------------------------------------------------

    def _on_datagram(self, body: bytes, source: Address) -> None:
        if self._phase is _Phase.CLOSED:
            return
        try:
            message = decode_message(body)
        except WireError as exc:
            log.debug("%s: malformed membership message from %s:%s: %s", self.self_id, *source, exc)
            return
        try:
            self._handle(message, source)
        except Exception as exc:
            self.last_error = f"handling {message.kind} from {message.sender}: {exc!r}"
            log.exception(
                "%s: failed to handle %s from %s", self.self_id, message.kind, message.sender
            )

    def _handle(self, message: Message, source: Address) -> None:
        sync_from = message.sender if message.kind == MessageKind.STATE else None
        for update in message.updates:
            self._merge(update, sync_from=sync_from)
        if message.sender == self.self_id:
            return
        self._heard(message.sender, source)
        kind = message.kind
        if kind == MessageKind.PING:
            self._on_ping(message, source)
        elif kind == MessageKind.ACK:
            relay = self._acks.on_ack(message.seq, message.sender)
            if relay is not None:
                self._send(
                    Message(MessageKind.ACK, self.self_id, relay.origin_seq), relay.requester
                )
        elif kind == MessageKind.NACK:
            self._acks.on_nack(message.seq, message.sender)
        elif kind == MessageKind.PING_REQ:
            self._on_ping_req(message, source)
        elif kind == MessageKind.SYNC:
            if message.digest != self._digest_now():
                self._send_state(source, reply=True)
        elif kind == MessageKind.STATE and message.reply:
            self._send_state(source, reply=False)

    def _heard(self, sender: str, source: Address) -> None:
        """Note a message from `sender`; a first contact adds it and syncs views with it."""
        now = self._clock()
        member = self._members.get(sender)
        self._heard_at[sender] = now
        if member is None:
            member = Member(sender, source[0], source[1], MemberState.ALIVE, 0, EMPTY_META, now)
            self._apply(None, MergeOutcome(member, EventKind.JOINED), None)
            self._start_sync(member, now, force=True)
        elif member.state == MemberState.DEAD or (
            member.state == MemberState.LEFT and now - member.state_since > self._sync_interval_s()
        ):
            self._start_sync(member, now)

    def _on_ping(self, message: Message, source: Address) -> None:
        if message.target is not None and message.target != self.self_id:
            log.debug("%s: ignoring a ping for %s", self.self_id, message.target)
            return
        extra = [self._self_update()] if message.target is None else []
        sender = self._members.get(message.sender)
        if sender is not None and sender.state != MemberState.ALIVE:
            extra.append(self._as_update(sender, None))
        self._send(Message(MessageKind.ACK, self.self_id, message.seq), source, extra)

    def _on_ping_req(self, message: Message, source: Address) -> None:
        target = message.target
        if target is None or target == self.self_id or message.target_address is None:
            return
        assert message.target_port is not None
        nack_after = self._tuning.nack_fraction * self._timeouts.indirect_probe_timeout_s
        seq = self._acks.relay(target, source, message.seq, nack_after, self._relay_expired)
        known = self._members.get(target)
        extra = (
            [self._as_update(known, None)]
            if known is not None and known.state != MemberState.ALIVE
            else []
        )
        ping = Message(MessageKind.PING, self.self_id, seq, target=target)
        self._send(ping, (message.target_address, message.target_port), extra)

    def _relay_expired(self, wait: RelayWait) -> None:
        self._send(Message(MessageKind.NACK, self.self_id, wait.origin_seq), wait.requester)

    # --- probing -------------------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            started = self._clock()
            try:
                self._housekeeping(started)
                target = self._next_target()
                if target is not None:
                    await self._probe(target)
            except Exception as exc:  # a background loop records its failure and keeps running
                self.last_error = f"probe loop: {exc!r}"
                log.exception("%s: membership probe round failed", self.self_id)
            wake_at = started + scaled_s(self._timeouts.probe_interval_s, self._health)
            delay = wake_at - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
                self._note_wake(wake_at)

    def _note_wake(self, expected: float) -> None:
        """Record a stall of our own loop when a timer fires later than the stall threshold."""
        now = self._clock()
        late = now - expected
        if late <= self._stall_threshold_s:
            return
        self._stalls.append((expected, now))
        level = logging.WARNING if now - self._stall_warned_at > _WARN_AGAIN_S else logging.DEBUG
        if level == logging.WARNING:
            self._stall_warned_at = now
        log.log(
            level,
            "%s: event loop stalled %.2fs; probe timeouts in that window do not count",
            self.self_id,
            late,
        )

    def _housekeeping(self, now: float) -> None:
        for endpoint in list(self._candidates)[: self._tuning.candidates_per_tick]:
            known = self._by_endpoint.get(endpoint)
            if known is not None and self._members[known].state in _UP:
                del self._candidates[endpoint]
            else:
                self._ping_candidate(endpoint)
        if now >= self._next_sync_at:
            self._next_sync_at = now + self._sync_interval_s() * self._rng.uniform(0.8, 1.2)
            for peer in self._pick(1, _ALIVE):
                self._start_sync(peer, now, force=True)
            dead = [i for i in self._down_since if self._members[i].state == MemberState.DEAD]
            if dead:
                self._start_sync(self._members[self._rng.choice(dead)], now, force=True)
        for node_id in reap_due(self._down_since, now, self._timeouts.dead_reap_s):
            self._reap(node_id)

    def _next_target(self) -> Member | None:
        """Round-robin over a shuffled list; a probe discounted by a stall is repeated first."""
        if self._reprobe is not None:
            member = self._members.get(self._reprobe)
            self._reprobe = None
            if member is not None and member.state in _UP:
                return member
        for _ in range(len(self._probe_order) + 1):
            if self._probe_index >= len(self._probe_order):
                self._probe_order = list(self._ids)
                self._rng.shuffle(self._probe_order)
                self._probe_index = 0
                if not self._probe_order:
                    return None
            node_id = self._probe_order[self._probe_index]
            self._probe_index += 1
            member = self._members.get(node_id)
            if member is not None and member.state in _UP:
                return member
        return None

    async def _wait(self, future: asyncio.Future[str], timeout_s: float) -> bool:
        due = self._clock() + timeout_s
        await asyncio.wait([future], timeout=timeout_s)
        if future.done():
            return True
        self._note_wake(due)
        return False

    async def _probe(self, target: Member) -> None:
        """Ping `target`; without an ack ping-req it through k others; then judge."""
        seq, wait = self._acks.expect(target.node_id)
        started = self._clock()
        relays: list[Member] = []
        try:
            extra = [self._as_update(target, None)] if target.state == MemberState.SUSPECT else []
            self._send(
                Message(MessageKind.PING, self.self_id, seq, target=target.node_id),
                target.endpoint,
                extra,
            )
            if await self._wait(
                wait.future, scaled_s(self._timeouts.probe_timeout_s, self._health)
            ):
                result = ProbeResult.ACKED
            else:
                relays = self._pick(self._tuning.k_indirect, _ALIVE, exclude={target.node_id})
                wait.relays = frozenset(relay.node_id for relay in relays)
                request = Message(
                    MessageKind.PING_REQ,
                    self.self_id,
                    seq,
                    target=target.node_id,
                    target_address=target.address,
                    target_port=target.port,
                )
                for relay in relays:
                    self._send(request, relay.endpoint)
                indirect_s = scaled_s(self._timeouts.indirect_probe_timeout_s, self._health)
                if await self._wait(wait.future, indirect_s):
                    result = ProbeResult.INDIRECT_ACKED
                elif overlaps_stall(self._stalls, started, self._clock()):
                    result = ProbeResult.DISCOUNTED
                else:
                    result = ProbeResult.FAILED
        finally:
            self._acks.forget(seq)
        delta = health_delta(result, len(relays), len(wait.nackers))
        self._health = apply_health(self._health, delta, self._tuning.max_health_score)
        if result == ProbeResult.DISCOUNTED:
            self._reprobe = target.node_id
            log.debug(
                "%s: probe of %s overlapped a stall of our loop; not counted",
                self.self_id,
                target.node_id,
            )
        elif result == ProbeResult.FAILED:
            self._suspect(target.node_id, wait.nackers)

    def _suspect(self, node_id: str, nackers: Iterable[str]) -> None:
        current = self._members.get(node_id)
        if current is None or current.state not in _UP:
            return
        if current.state == MemberState.ALIVE:
            update = Update(node_id, MemberState.SUSPECT, current.incarnation, by=self.self_id)
            self._apply(
                current, merge_remote(current, update, self._clock(), from_sync=False), self.self_id
            )
        elif self._suspicions.confirm(node_id, self.self_id):
            self._queue_update(
                Update(node_id, MemberState.SUSPECT, current.incarnation, by=self.self_id)
            )
        for relay in nackers:
            self._suspicions.confirm(node_id, relay)
