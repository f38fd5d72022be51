"""The decisions of SWIM with Lifeguard, as pure functions: precedence, merging, refutation,
suspicion timeouts, local health, stall discounting, gossip and sync budgets.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from operator import attrgetter

from node.membership.types import (
    EMPTY_META,
    Address,
    EventKind,
    Member,
    MemberState,
    Update,
)

_RANK = {
    MemberState.ALIVE: 0,
    MemberState.SUSPECT: 1,
    MemberState.DEAD: 2,
    MemberState.LEFT: 3,
}
_DOWN = (MemberState.DEAD, MemberState.LEFT)
_UP = (MemberState.ALIVE, MemberState.SUSPECT)
_NODE_ID = attrgetter("node_id")
_NO_META = "\x1f?"


def supersedes(
    state: MemberState, incarnation: int, over_state: MemberState, over_incarnation: int
) -> bool:
    """True when (state, incarnation) overrides (over_state, over_incarnation).

    SWIM precedence, ordered by incarnation first: a higher incarnation always wins; at the same
    incarnation alive < suspect < dead < left. So alive(i) beats suspect(j) only if i > j,
    suspect(i) beats alive(j) if i >= j, dead and left beat alive and suspect at the same
    incarnation, and a dead or left member comes back only with a higher incarnation.
    """
    return (incarnation, _RANK[state]) > (over_incarnation, _RANK[over_state])


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """What merging one update about another member does: the record to store (None: ignore),
    the event to tell listeners, whether to gossip the update on, a newly seen id conflict."""

    member: Member | None = None
    event: EventKind | None = None
    gossip: bool = False
    conflict: Address | None = None


IGNORE = MergeOutcome()


def event_for(previous: Member | None, member: Member) -> EventKind | None:
    """The listener event for replacing `previous` by `member` (None: nothing visible changed)."""
    if previous is None:
        return EventKind.JOINED
    if previous.state != member.state:
        return EventKind(member.state.value)
    if member.state == MemberState.ALIVE and (
        previous.endpoint != member.endpoint or dict(previous.meta) != dict(member.meta)
    ):
        return EventKind.UPDATED
    return None


def fills_meta(current: Member, update: Update) -> bool:
    """True when `update` brings the meta of a member known without any: one first heard from a
    message carrying no record of its sender (node.membership.protocol adds it alive at
    incarnation 0 with no meta). Its own record at that same state and incarnation does not
    supersede the placeholder, so without this its meta (release, protocol, GPUs, role) stayed
    unknown at this node until the member's next incarnation."""
    return (
        bool(update.meta)
        and not current.meta
        and update.state == current.state
        and update.incarnation == current.incarnation
        and update.endpoint in (None, current.endpoint)
    )


def merge_remote(
    current: Member | None, update: Update, now: float, *, from_sync: bool
) -> MergeOutcome:
    """Merge an update about another member into its record `current` (None if unknown).

    Unknown members are added only from alive updates or full-state records that carry an
    address; updates learned by push-pull are gossiped on only when they change a known member's
    state (a joining node's full state must not start a gossip storm). A member that flips back
    to an address it just moved away from is claimed by two live nodes: an id conflict.
    """
    if current is None:
        endpoint = update.endpoint
        if endpoint is None or update.state not in _UP:
            return IGNORE
        member = Member(
            node_id=update.node_id,
            address=endpoint[0],
            port=endpoint[1],
            state=update.state,
            incarnation=update.incarnation,
            meta=update.meta if update.meta is not None else EMPTY_META,
            state_since=now,
        )
        return MergeOutcome(member, EventKind.JOINED, gossip=not from_sync)
    if update.meta is not None and fills_meta(current, update):
        return MergeOutcome(replace(current, meta=update.meta), EventKind.UPDATED)
    if not supersedes(update.state, update.incarnation, current.state, current.incarnation):
        return IGNORE
    address, port = current.address, current.port
    previous_address = current.previous_address
    conflict = current.conflict
    new_conflict: Address | None = None
    endpoint = update.endpoint
    if endpoint is not None and endpoint != current.endpoint:
        if current.state in _UP:
            if endpoint == current.previous_address and conflict is None:
                new_conflict = current.endpoint
                conflict = new_conflict
            previous_address = current.endpoint
        else:
            previous_address = None
        address, port = endpoint
    member = Member(
        node_id=current.node_id,
        address=address,
        port=port,
        state=update.state,
        incarnation=update.incarnation,
        meta=update.meta if update.meta is not None else current.meta,
        state_since=now if update.state != current.state else current.state_since,
        conflict=conflict,
        previous_address=previous_address,
    )
    gossip = not from_sync or member.state != current.state
    return MergeOutcome(member, event_for(current, member), gossip, new_conflict)


def is_confirmation(current: Member | None, update: Update, self_id: str) -> bool:
    """True when `update` is another member's independent suspicion of a current suspect."""
    return (
        current is not None
        and current.state == MemberState.SUSPECT
        and update.state == MemberState.SUSPECT
        and update.incarnation == current.incarnation
        and update.by is not None
        and update.by != self_id
    )


def from_sync(update: Update, sender: str) -> Update:
    """A full-state record as a merge input: a peer's `dead` only makes us suspect (memberlist)."""
    if update.state != MemberState.DEAD:
        return update
    return Update(
        update.node_id,
        MemberState.SUSPECT,
        update.incarnation,
        update.address,
        update.port,
        update.meta,
        by=sender,
    )


@dataclass(frozen=True, slots=True)
class SelfOutcome:
    """What an update about ourselves asks of us: refute with a new incarnation (None: nothing);
    `foreign` is the address of another claimant of our id; `conflict` when that claimant is live
    (it raised its incarnation past our previous refutation); `suspected` when we were suspected."""

    refute_to: int | None = None
    foreign: Address | None = None
    conflict: bool = False
    suspected: bool = False


def merge_self(
    me: Member, update: Update, *, leaving: bool, refuted: Mapping[Address, int]
) -> SelfOutcome:
    """Decide on an update about our own id. `refuted` maps a foreign address to the incarnation
    we last refuted its claim with."""
    if leaving:
        return SelfOutcome()
    bump = max(me.incarnation, update.incarnation) + 1
    endpoint = update.endpoint
    if endpoint is not None and endpoint != me.endpoint:
        if update.incarnation < me.incarnation:
            return SelfOutcome()
        prior = refuted.get(endpoint)
        live = prior is not None and update.incarnation >= prior
        return SelfOutcome(refute_to=bump, foreign=endpoint, conflict=live)
    if update.state == MemberState.ALIVE:
        stale_life = update.incarnation > me.incarnation or (
            update.incarnation == me.incarnation
            and update.meta is not None
            and dict(update.meta) != dict(me.meta)
        )
        return SelfOutcome(refute_to=bump) if stale_life else SelfOutcome()
    if update.incarnation < me.incarnation:
        return SelfOutcome()
    return SelfOutcome(refute_to=bump, suspected=update.state == MemberState.SUSPECT)


# --- suspicion (Lifeguard) ------------------------------------------------------------------


def suspicion_bounds_s(suspicion_s: float, members: int, max_mult: float) -> tuple[float, float]:
    """(min, max) suspicion time: min = suspicion_s * max(1, log10(N)), max = min * max_mult."""
    low = suspicion_s * max(1.0, math.log10(max(members, 1)))
    return low, low * max_mult


def suspicion_members(states: Iterable[MemberState]) -> int:
    """N of the suspicion formulas: this node and every other member but those that left on
    purpose (a member that left never confirms a suspicion and is no failure to wait for)."""
    return 1 + sum(1 for state in states if state != MemberState.LEFT)


def expected_confirmations(k_indirect: int, members: int, nacks: int = 0) -> int:
    """How many independent suspicions shrink a suspicion to its minimum: k, at most N - 2.

    Once `nacks` relays of our own failed probe nacked, only that many: our path works, so
    relays that stayed silent are cut off from us (across a partition), and members we could
    not pick as relays are down; neither will confirm. Without a nack we may be the slow one
    and wait for every confirmation.
    """
    full = max(0, min(k_indirect, members - 2))
    return min(full, nacks) if nacks > 0 else full


def suspicion_timeout_s(confirmations: int, expected: int, low_s: float, high_s: float) -> float:
    """Lifeguard's dynamic suspicion: from high_s with no confirmation down to low_s with
    `expected` of them, logarithmically."""
    if expected < 1 or confirmations >= expected:
        return low_s
    fraction = math.log(confirmations + 1) / math.log(expected + 1)
    return max(low_s, high_s - (high_s - low_s) * fraction)


@dataclass(frozen=True, slots=True)
class Suspicion:
    """A running suspicion of one member at one incarnation, started by `origin`; `confirmers`
    are the distinct other members (or ping-req relays that reported failure) that agree."""

    node_id: str
    incarnation: int
    started_at: float
    origin: str
    confirmers: frozenset[str]
    expected: int
    low_s: float
    high_s: float

    @property
    def deadline(self) -> float:
        timeout = suspicion_timeout_s(len(self.confirmers), self.expected, self.low_s, self.high_s)
        return self.started_at + timeout

    def confirmed_by(self, node_id: str) -> Suspicion:
        """This suspicion with `node_id` agreeing (the origin does not confirm itself)."""
        if node_id == self.origin or node_id in self.confirmers:
            return self
        return Suspicion(
            self.node_id,
            self.incarnation,
            self.started_at,
            self.origin,
            self.confirmers | {node_id},
            self.expected,
            self.low_s,
            self.high_s,
        )


def suspicion_longest(suspicion: Suspicion, heard_at: float | None, now: float) -> float:
    """How much longer an expired suspicion runs (0: the member is dead now).

    A suspect we heard from after suspecting it is alive but slow to refute: its refutation
    may wait behind its own bulk traffic, or it has not heard of the suspicion yet. It gets the
    unconfirmed (longest) timeout, however many confirmed, instead of the confirmed one; a
    member that stays silent is dead at the usual time."""
    if heard_at is None or heard_at <= suspicion.started_at:
        return 0.0
    return max(0.0, suspicion.started_at + suspicion.high_s - now)


# --- local health (Lifeguard) and stalls ----------------------------------------------------


class ProbeResult(enum.StrEnum):
    """How one probe ended."""

    ACKED = "acked"
    INDIRECT_ACKED = "indirect_acked"
    FAILED = "failed"
    DISCOUNTED = "discounted"


def health_delta(result: ProbeResult, expected_nacks: int, nacks: int) -> int:
    """Change of the local health score after a probe: a direct ack heals, a failure whose relays
    did not even nack means we are the slow one (Lifeguard's local health multiplier).

    One nack is enough to acquit us: our ping-req went out and the relay's answer came back in
    time, so relays that stayed silent are cut off themselves, as across a partition, and do not
    count. A failure that no relay nacked counts once, not once per relay: right after a cut,
    every relay may be beyond it. (Counting each silent relay, as memberlist does, slowed a
    partition's minority side down to one probe per 4.5 s and its verdict to ~10 s.)"""
    if result == ProbeResult.ACKED:
        return -1
    if result == ProbeResult.FAILED:
        return 1 if nacks == 0 else 0
    return 0


def apply_health(score: int, delta: int, max_score: int) -> int:
    return min(max_score, max(0, score + delta))


def scaled_s(base_s: float, score: int) -> float:
    """A timeout lengthened by the local health score: base * (score + 1)."""
    return base_s * (score + 1)


def stall_threshold_s(probe_timeout_s: float, floor_s: float) -> float:
    """How late a timer may fire before we call it a stall of our own event loop."""
    return max(floor_s, probe_timeout_s / 2)


def overlaps_stall(stalls: Iterable[tuple[float, float]], start: float, end: float) -> bool:
    """True when a stall window (from, to) overlaps [start, end]: a timeout in that window may be
    our own fault, not the peer's, so it does not count."""
    return any(stall_end > start and stall_start < end for stall_start, stall_end in stalls)


# --- gossip, sync, reaping -------------------------------------------------------------------


def retransmit_limit(mult: int, members: int) -> int:
    """How many times each update is sent: mult * ceil(log10(N + 1))."""
    return mult * max(1, math.ceil(math.log10(members + 1)))


def sync_interval_s(probe_interval_s: float, every_probes: int, members: int) -> float:
    """Push-pull period: every_probes probe intervals, scaled up like memberlist past 32 members."""
    base = probe_interval_s * every_probes
    if members <= 32:
        return base
    return base * (math.ceil(math.log2(members) - math.log2(32)) + 1)


def reap_due(down_since: Mapping[str, float], now: float, dead_reap_s: float) -> list[str]:
    """Ids of dead or left members held longer than dead_reap_s."""
    return [node_id for node_id, since in down_since.items() if now - since >= dead_reap_s]


def view_digest(members: Iterable[Member]) -> str:
    """A short hash of (id, incarnation, state) of every member: equal views skip push-pull.

    An up member whose meta this view lacks (a placeholder: see `fills_meta`) is marked, so the
    view differs from every view that knows that meta and a push-pull brings it. Unmarked, a
    new node that first heard of a member through a record without meta kept it meta-less (no
    release, no GPUs) for as long as nothing about it changed: gossip carries only changes."""
    lines = [
        f"{member.node_id}\x1f{member.incarnation}\x1f{member.state}"
        f"{_NO_META if not member.meta and member.state in _UP else ''}\x1e"
        for member in sorted(members, key=_NODE_ID)
    ]
    return hashlib.blake2b("".join(lines).encode(), digest_size=8).hexdigest()
