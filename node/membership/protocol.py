"""The SWIM protocol engine behind `Membership`: merging updates, suspicion, sending with
piggybacked gossip, handling received messages, and the probe loop with stall discounting.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import chain

from config.timeouts import Timeouts
from node.membership.events import EventHub
from node.membership.gossip import GossipQueue
from node.membership.rules import (
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
)
from node.membership.table import UP, MemberTable
from node.membership.timers import AckTable, RelayWait, SuspicionTimers
from node.membership.transport import MembershipTransport
from node.membership.types import (
    EMPTY_META,
    Address,
    EventKind,
    Member,
    MemberState,
    SwimTuning,
    Update,
)
from node.membership.wire import (
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

log = logging.getLogger("node.membership.service")

_ALIVE = (MemberState.ALIVE,)
_STALL_WARN_AGAIN_S = 600.0
_MAX_JOIN_SEQS = 256


class Phase(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    LEAVING = "leaving"
    CLOSED = "closed"


class SwimProtocol:
    """The protocol state of one node and its handlers; `Membership` adds the lifecycle and API.

    Invariant: everything runs on one event loop and no handler awaits, so a received message is
    merged completely before the next one or any timer runs.
    """

    def __init__(
        self,
        me: Member,
        transport: MembershipTransport,
        timeouts: Timeouts,
        tuning: SwimTuning,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self._timeouts = timeouts
        self._tuning = tuning
        self._transport = transport
        self._rng = rng
        self._clock = clock
        self._id = me.node_id
        self._table = MemberTable(me, rng)
        self._events = EventHub(me.node_id, clock)
        self._queue = GossipQueue()
        self._acks = AckTable(rng)
        self._suspicions = SuspicionTimers(clock, self._suspicion_expired)
        self._candidates: dict[Address, int] = {}
        self._join_seqs: dict[int, Address] = {}
        self._reprobe: str | None = None
        self._stalls: deque[tuple[float, float]] = deque(maxlen=32)
        self._stall_threshold_s = stall_threshold_s(
            timeouts.probe_timeout_s, tuning.stall_threshold_min_s
        )
        self._stall_warned_at = -math.inf
        self._health = 0
        self._refuted: dict[Address, int] = {}
        self._conflict_refuted_at: dict[Address, float] = {}
        self._gossip_handle: asyncio.Handle | None = None
        self._phase = Phase.NEW
        self._next_sync_at = 0.0
        self.last_error: str | None = None

    @property
    def self_id(self) -> str:
        return self._id

    # --- events ----------------------------------------------------------------------------

    def _emit(self, kind: EventKind, member: Member, previous: MemberState | None) -> None:
        self._events.emit(kind, self._table.view(member, self._clock()), previous)

    def _report_conflict(self, member: Member, other: Address) -> None:
        if member.node_id == self._id:
            member = replace(member, conflict=other)
            self._table.me = member
        self._events.conflict(self._table.view(member, self._clock()), other)

    # --- merging updates ---------------------------------------------------------------------

    def _self_update(self) -> Update:
        me = self._table.me
        if me.state == MemberState.LEFT:
            return Update(me.node_id, MemberState.LEFT, me.incarnation, me.address, me.port)
        return Update(me.node_id, MemberState.ALIVE, me.incarnation, me.address, me.port, me.meta)

    def _as_update(self, member: Member, by: str | None) -> Update:
        node_id, state, incarnation = member.node_id, member.state, member.incarnation
        if state == MemberState.ALIVE:
            return Update(node_id, state, incarnation, member.address, member.port, member.meta)
        if state == MemberState.LEFT:
            return Update(node_id, state, incarnation)
        return Update(node_id, state, incarnation, by=by or self._id)

    def _merge(self, update: Update, *, sync_from: str | None = None) -> None:
        if update.node_id == self._id:
            self._merge_self(update)
            return
        current = self._table.get(update.node_id)
        if sync_from is not None:
            if current is None and update.state not in UP:
                return
            update = from_sync(update, sync_from)
        if is_confirmation(current, update, self._id):
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
        self._table.store(current, member)
        if member.state != MemberState.SUSPECT:
            self._suspicions.cancel(member.node_id)
        elif (
            current is None
            or current.state != member.state
            or current.incarnation != member.incarnation
        ):
            self._start_suspicion(member, by or self._id)
        if outcome.gossip:
            self._queue_update(self._as_update(member, by))
        if current is not None and current.state in UP and current.endpoint != member.endpoint:
            # Tell the old address: if a live node is still there, it refutes at once, and two
            # live claimants of one id find each other in a few messages instead of sync rounds.
            hint = Message(MessageKind.GOSSIP, self._id, 0)
            self._send(hint, current.endpoint, [self._as_update(member, by)])
        if outcome.event is not None:
            self._emit(outcome.event, member, None if current is None else current.state)
        if outcome.conflict is not None:
            self._report_conflict(member, outcome.conflict)

    def _merge_self(self, update: Update) -> None:
        me = self._table.me
        leaving = self._phase is not Phase.RUNNING
        outcome = merge_self(me, update, leaving=leaving, refuted=self._refuted)
        if outcome.refute_to is None:
            return
        now = self._clock()
        foreign = outcome.foreign
        if foreign is not None:
            in_conflict = self._events.in_conflict(self._id, foreign)
            if outcome.conflict:
                self._report_conflict(me, foreign)
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
            self._id,
            update.state,
            update.incarnation,
            outcome.refute_to,
        )
        self._table.me = replace(self._table.me, incarnation=outcome.refute_to)
        self._queue_update(self._self_update())

    def _start_suspicion(self, member: Member, origin: str) -> None:
        size = self._table.size
        low, high = suspicion_bounds_s(
            self._timeouts.suspicion_s, size, self._tuning.suspicion_max_mult
        )
        expected = expected_confirmations(self._tuning.k_indirect, size)
        suspicion = Suspicion(
            member.node_id,
            member.incarnation,
            self._clock(),
            origin,
            frozenset(),
            expected,
            low,
            high,
        )
        self._suspicions.start(suspicion)

    def _suspicion_expired(self, suspicion: Suspicion, due: float, checked_from: float) -> None:
        self._note_wake(due)
        member = self._table.get(suspicion.node_id)
        if (
            self._phase is not Phase.RUNNING
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
        dead = Update(suspicion.node_id, MemberState.DEAD, suspicion.incarnation, by=self._id)
        self._merge(dead)

    def _suspect(self, node_id: str, nackers: Iterable[str]) -> None:
        """Our probe of `node_id` failed: suspect it, or confirm a running suspicion."""
        current = self._table.get(node_id)
        if current is None or current.state not in UP:
            return
        me = self._id
        if current.state == MemberState.ALIVE:
            update = Update(node_id, MemberState.SUSPECT, current.incarnation, by=me)
            self._apply(current, merge_remote(current, update, self._clock(), from_sync=False), me)
        elif self._suspicions.confirm(node_id, me):
            self._queue_update(Update(node_id, MemberState.SUSPECT, current.incarnation, by=me))
        for relay in nackers:
            self._suspicions.confirm(node_id, relay)

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
        limit = retransmit_limit(self._tuning.retransmit_mult, self._table.size)
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
        if self._gossip_handle is not None or self._phase not in (Phase.RUNNING, Phase.LEAVING):
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
        for peer in self._table.pick(self._tuning.gossip_fanout, UP):
            message = Message(MessageKind.GOSSIP, self._id, 0)
            sent = self._send(message, peer.endpoint, only_with_updates=True) or sent
        if sent and len(self._queue):
            self._arm_gossip(self._timeouts.probe_interval_s * self._tuning.gossip_interval_mult)

    def _sync_interval_s(self) -> float:
        every = self._tuning.sync_every_probes
        return sync_interval_s(self._timeouts.probe_interval_s, every, self._table.size)

    def _start_sync(self, member: Member, now: float, *, force: bool = False) -> None:
        """Push-pull: offer our view's digest; a peer whose view differs sends its own back."""
        last = self._table.synced_at.get(member.node_id, -math.inf)
        if not force and now - last < self._sync_interval_s():
            return
        self._table.synced_at[member.node_id] = now
        seq = self._acks.next_seq()
        message = Message(MessageKind.SYNC, self._id, seq, digest=self._table.digest())
        self._transport.send(encode_header(message), member.endpoint)

    def _send_state(self, address: Address, *, reply: bool) -> None:
        records = chain([self._table.me], self._table)
        blobs = [encode_update(member_record(member)) for member in records]
        seq = self._acks.next_seq()
        for body in state_chunks(self._id, seq, reply, blobs, self._transport.body_budget):
            self._transport.send(body, address)

    def _ping_candidate(self, endpoint: Address) -> None:
        attempts = self._candidates.get(endpoint, 0) - 1
        if attempts <= 0:
            self._candidates.pop(endpoint, None)
        else:
            self._candidates[endpoint] = attempts
        seq = self._acks.next_seq()
        self._join_seqs[seq] = endpoint
        while len(self._join_seqs) > _MAX_JOIN_SEQS:
            del self._join_seqs[next(iter(self._join_seqs))]
        message = Message(MessageKind.PING, self._id, seq, target=None)
        self._send(message, endpoint, [self._self_update()])

    # --- receiving -----------------------------------------------------------------------------

    def _on_datagram(self, body: bytes, source: Address) -> None:
        if self._phase is Phase.CLOSED:
            return
        try:
            message = decode_message(body)
        except WireError as exc:
            log.debug("%s: malformed message from %s:%s: %s", self._id, *source, exc)
            return
        try:
            self._handle(message, source)
        except Exception as exc:
            self.last_error = f"handling {message.kind} from {message.sender}: {exc!r}"
            log.exception("%s: failed to handle %s from %s", self._id, message.kind, source)

    def _handle(self, message: Message, source: Address) -> None:
        sync_from = message.sender if message.kind == MessageKind.STATE else None
        for update in message.updates:
            self._merge(update, sync_from=sync_from)
        if message.sender == self._id:
            return
        self._heard(message.sender, source)
        kind = message.kind
        if kind == MessageKind.PING:
            self._on_ping(message, source)
        elif kind == MessageKind.ACK:
            if self._join_seqs.pop(message.seq, None) is not None:
                joined = self._table.get(message.sender)
                if joined is not None:
                    self._start_sync(joined, self._clock(), force=True)  # push-pull on join
            relay = self._acks.on_ack(message.seq, message.sender)
            if relay is not None:
                self._send(Message(MessageKind.ACK, self._id, relay.origin_seq), relay.requester)
        elif kind == MessageKind.NACK:
            self._acks.on_nack(message.seq, message.sender)
        elif kind == MessageKind.PING_REQ:
            self._on_ping_req(message, source)
        elif kind == MessageKind.SYNC:
            if message.digest != self._table.digest():
                self._send_state(source, reply=True)
        elif kind == MessageKind.STATE and message.reply:
            self._send_state(source, reply=False)

    def _heard(self, sender: str, source: Address) -> None:
        """Note a message from `sender`; a first contact adds it and syncs views with it."""
        now = self._clock()
        member = self._table.get(sender)
        self._table.heard_at[sender] = now
        if member is None:
            member = Member(sender, source[0], source[1], MemberState.ALIVE, 0, EMPTY_META, now)
            self._apply(None, MergeOutcome(member, EventKind.JOINED), None)
            self._start_sync(member, now, force=True)
        elif member.state == MemberState.DEAD or (
            member.state == MemberState.LEFT and now - member.state_since > self._sync_interval_s()
        ):
            self._start_sync(member, now)

    def _on_ping(self, message: Message, source: Address) -> None:
        if message.target is not None and message.target != self._id:
            log.debug("%s: ignoring a ping for %s", self._id, message.target)
            return
        extra = [self._self_update()] if message.target is None else []
        sender = self._table.get(message.sender)
        if sender is not None and sender.state != MemberState.ALIVE:
            extra.append(self._as_update(sender, None))
        self._send(Message(MessageKind.ACK, self._id, message.seq), source, extra)

    def _on_ping_req(self, message: Message, source: Address) -> None:
        target, address, port = message.target, message.target_address, message.target_port
        if target is None or target == self._id or address is None or port is None:
            return
        nack_after = self._tuning.nack_fraction * self._timeouts.indirect_probe_timeout_s
        seq = self._acks.relay(target, source, message.seq, nack_after, self._relay_expired)
        known = self._table.get(target)
        extra = []
        if known is not None and known.state != MemberState.ALIVE:
            extra.append(self._as_update(known, None))
        ping = Message(MessageKind.PING, self._id, seq, target=target)
        self._send(ping, (address, port), extra)

    def _relay_expired(self, wait: RelayWait) -> None:
        self._send(Message(MessageKind.NACK, self._id, wait.origin_seq), wait.requester)

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
                log.exception("%s: membership probe round failed", self._id)
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
        warn = now - self._stall_warned_at > _STALL_WARN_AGAIN_S
        if warn:
            self._stall_warned_at = now
        log.log(
            logging.WARNING if warn else logging.DEBUG,
            "%s: event loop stalled %.2fs; probe timeouts in that window do not count",
            self._id,
            late,
        )

    def _housekeeping(self, now: float) -> None:
        for endpoint in list(self._candidates)[: self._tuning.candidates_per_tick]:
            known = self._table.at(endpoint)
            if known is not None and known.state in UP:
                del self._candidates[endpoint]
            else:
                self._ping_candidate(endpoint)
        if now >= self._next_sync_at:
            self._next_sync_at = now + self._sync_interval_s() * self._rng.uniform(0.8, 1.2)
            for peer in self._table.pick(1, _ALIVE):
                self._start_sync(peer, now, force=True)
            for peer in self._table.pick(1, (MemberState.DEAD,)):
                self._start_sync(peer, now, force=True)
        for node_id in reap_due(self._table.down_since, now, self._timeouts.dead_reap_s):
            member = self._table.remove(node_id)
            self._queue.discard(node_id)
            self._suspicions.cancel(node_id)
            self._events.forget(node_id)
            self._emit(EventKind.REAPED, member, member.state)

    def _next_target(self) -> Member | None:
        if self._reprobe is not None:
            member = self._table.get(self._reprobe)
            self._reprobe = None
            if member is not None and member.state in UP:
                return member
        return self._table.next_probe_target()

    async def _wait(self, future: asyncio.Future[str], timeout_s: float) -> bool:
        due = self._clock() + timeout_s
        await asyncio.wait([future], timeout=timeout_s)
        self._note_wake(due)  # also when acked: resuming long after `due` means we stalled
        return future.done()

    async def _probe(self, target: Member) -> None:
        """Ping `target`; without an ack, ping-req it through k others; then judge."""
        seq, wait = self._acks.expect(target.node_id)
        started = self._clock()
        relays: list[Member] = []
        try:
            extra = [self._as_update(target, None)] if target.state == MemberState.SUSPECT else []
            ping = Message(MessageKind.PING, self._id, seq, target=target.node_id)
            self._send(ping, target.endpoint, extra)
            if await self._wait(
                wait.future, scaled_s(self._timeouts.probe_timeout_s, self._health)
            ):
                result = ProbeResult.ACKED
            else:
                relays = self._table.pick(self._tuning.k_indirect, _ALIVE, {target.node_id})
                wait.relays = frozenset(relay.node_id for relay in relays)
                request = Message(
                    MessageKind.PING_REQ,
                    self._id,
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
            log.debug("%s: probe of %s overlapped a stall; not counted", self._id, target.node_id)
        elif result == ProbeResult.FAILED:
            self._suspect(target.node_id, wait.nackers)
