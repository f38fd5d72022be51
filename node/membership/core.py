"""The state of one SWIM node and its outbox: events, sending with piggybacked gossip, eager
gossip, push-pull offers, join pings, and the record of our own event loop's stalls.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import chain

from config.timeouts import Timeouts
from node.membership.events import EventHub
from node.membership.gossip import GossipQueue
from node.membership.rules import retransmit_limit, stall_threshold_s, sync_interval_s
from node.membership.table import UP, MemberTable
from node.membership.timers import AckTable
from node.membership.transport import MembershipTransport
from node.membership.types import Address, EventKind, Member, MemberState, SwimTuning, Update
from node.membership.wire import (
    Message,
    MessageKind,
    assemble,
    encode_header,
    encode_update,
    member_record,
    state_chunks,
)

log = logging.getLogger("node.membership.service")

_STALL_WARN_AGAIN_S = 600.0
_MAX_JOIN_SEQS = 256


class Phase(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    LEAVING = "leaving"
    CLOSED = "closed"


class ProtocolCore:
    """What every layer of the protocol shares: the member table, the gossip queue, outstanding
    acks, and sending. `MergingProtocol` adds merging and suspicion, `SwimProtocol` receiving
    and probing, `Membership` the lifecycle and API.

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
        self.refused_datagrams = 0
        """Datagrams dropped because their sender is refused."""

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

    # --- sending -------------------------------------------------------------------------------

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
