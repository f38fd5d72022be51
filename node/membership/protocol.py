"""The SWIM protocol engine behind `Membership`: handling received messages, and the probe loop
with stall discounting. Built on `MergingProtocol` (merging, suspicion) and `ProtocolCore`
(state, sending).
"""

from __future__ import annotations

import asyncio
import logging

from node.membership.core import Phase, ProtocolCore
from node.membership.merging import MergingProtocol
from node.membership.rules import (
    MergeOutcome,
    ProbeResult,
    apply_health,
    health_delta,
    overlaps_stall,
    reap_due,
    scaled_s,
)
from node.membership.table import UP
from node.membership.timers import RelayWait
from node.membership.types import EMPTY_META, Address, EventKind, Member, MemberState
from node.membership.wire import Message, MessageKind, WireError, decode_message

__all__ = ["Phase", "ProtocolCore", "SwimProtocol"]

log = logging.getLogger("node.membership.service")

_ALIVE = (MemberState.ALIVE,)


class SwimProtocol(MergingProtocol):
    """The protocol state of one node and its handlers; `Membership` adds the lifecycle and API."""

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
        refusal = self._table.refused.get(message.sender)
        if refusal is not None and not any(
            update.node_id == message.sender and refusal.lifted_by(update)
            for update in message.updates
        ):
            self.refused_datagrams += 1
            return
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
        """Note a message from `sender`: proof it is alive, so our probes of it (and probes we
        relay to it) end acked, however late its ack; a first contact adds it and syncs views
        with it."""
        now = self._clock()
        member = self._table.get(sender)
        self._table.heard_at[sender] = now
        for relay in self._acks.heard(sender):
            self._send(Message(MessageKind.ACK, self._id, relay.origin_seq), relay.requester)
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
                relays = self._table.pick_relays(self._tuning.k_indirect, {target.node_id})
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
