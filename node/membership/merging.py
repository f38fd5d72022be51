"""Merging updates into the view and running suspicions (SWIM with Lifeguard), the layer of
the protocol between its outbox (`ProtocolCore`) and its handlers (`SwimProtocol`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Collection
from dataclasses import replace

from config.timeouts import Timeouts
from node.membership.core import Phase, ProtocolCore
from node.membership.rules import (
    MergeOutcome,
    Suspicion,
    apply_health,
    expected_confirmations,
    from_sync,
    is_confirmation,
    merge_remote,
    merge_self,
    overlaps_stall,
    scaled_s,
    suspicion_bounds_s,
    suspicion_longest,
)
from node.membership.table import UP
from node.membership.timers import SuspicionTimers
from node.membership.transport import MembershipTransport
from node.membership.types import Member, MemberState, SwimTuning, Update
from node.membership.wire import Message, MessageKind

log = logging.getLogger("node.membership.service")


class MergingProtocol(ProtocolCore):
    """Merges updates (about others and about ourselves) and turns suspicions into deaths."""

    def __init__(
        self,
        me: Member,
        transport: MembershipTransport,
        timeouts: Timeouts,
        tuning: SwimTuning,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(me, transport, timeouts, tuning, rng, clock)
        self._suspicions = SuspicionTimers(clock, self._suspicion_expired)

    def _merge(self, update: Update, *, sync_from: str | None = None) -> None:
        if update.node_id == self._id:
            self._merge_self(update)
            return
        refusal = self._table.refused.get(update.node_id)
        if refusal is not None and update.state in UP:
            if not refusal.lifted_by(update):
                return  # a refused member stays down, whoever says it is alive
            del self._table.refused[update.node_id]
            log.warning(
                "%s: %s advertises another %s: no longer refused (%s)",
                self._id,
                update.node_id,
                refusal.mark[0] if refusal.mark else "mark",
                refusal.reason,
            )
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

    def _apply(
        self, current: Member | None, outcome: MergeOutcome, by: str | None, *, nacks: int = 0
    ) -> None:
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
            self._start_suspicion(member, by or self._id, nacks)
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

    def _start_suspicion(self, member: Member, origin: str, nacks: int = 0) -> None:
        size = self._table.suspicion_size
        low, high = suspicion_bounds_s(
            self._timeouts.suspicion_s, size, self._tuning.suspicion_max_mult
        )
        expected = expected_confirmations(self._tuning.k_indirect, size, nacks)
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
        if origin == self._id:
            # Lifeguard's buddy system at once: the suspect hears it from us, not by chance
            # gossip, and refutes before the (short) confirmed timeout if it is alive.
            notice = Message(MessageKind.GOSSIP, self._id, 0)
            self._send(notice, member.endpoint, [self._as_update(member, origin)])

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
        longest = suspicion_longest(suspicion, self._table.heard_at.get(member.node_id), now)
        if longest > 0:
            self._suspicions.extend(suspicion, longest, checked_from)
            return
        dead = Update(suspicion.node_id, MemberState.DEAD, suspicion.incarnation, by=self._id)
        self._merge(dead)

    def _suspect(self, node_id: str, nackers: Collection[str]) -> None:
        """Our probe of `node_id` failed: suspect it, or confirm a running suspicion; relays
        that nacked confirm it (and are all the confirmation we wait for)."""
        current = self._table.get(node_id)
        if current is None or current.state not in UP:
            return
        me = self._id
        if current.state == MemberState.ALIVE:
            update = Update(node_id, MemberState.SUSPECT, current.incarnation, by=me)
            outcome = merge_remote(current, update, self._clock(), from_sync=False)
            self._apply(current, outcome, me, nacks=len(nackers))
        elif self._suspicions.confirm(node_id, me):
            self._queue_update(Update(node_id, MemberState.SUSPECT, current.incarnation, by=me))
        for relay in nackers:
            self._suspicions.confirm(node_id, relay)
