"""The view's bookkeeping: members by id and by address, when each was last heard from and went
down, random picks, the shuffled probe order, and the view digest."""

from __future__ import annotations

import math
import random
from collections.abc import Container, Iterable, Iterator
from itertools import chain
from operator import attrgetter

from node.membership.rules import view_digest
from node.membership.types import Address, Member, MemberState, MemberView, Refusal

UP = (MemberState.ALIVE, MemberState.SUSPECT)
_NODE_ID = attrgetter("node_id")
_ENDPOINT = attrgetter("address", "port")
_STATE = attrgetter("state")


class MemberTable:
    """Members of one node's view and their indexes (a class: it owns mutable indexes that must
    change together). `me` is this node; it is never among `get`/`pick` results."""

    def __init__(self, me: Member, rng: random.Random) -> None:
        self._me = me
        self._rng = rng
        self._members: dict[str, Member] = {}
        self._ids: list[str] = []
        # Both indexes are built on first need: a warm start of a large view (and a simulation
        # holding thousands of views) pays for neither until a member is removed or an address
        # looked up. `_by_endpoint` stays None only while every member's endpoint is distinct.
        self._id_index: dict[str, int] | None = {}
        self._by_endpoint: dict[Address, str] | None = {}
        self.heard_at: dict[str, float] = {}
        self.down_since: dict[str, float] = {}
        self.synced_at: dict[str, float] = {}
        self.refused: dict[str, Refusal] = {}
        """Members this node will not hear (Membership.refuse), with why."""
        self._probe_order: list[str] = []
        self._probe_index = 0
        self._version = 0
        self._digest: tuple[int, str] = (-1, "")
        self._left = 0

    @property
    def me(self) -> Member:
        return self._me

    @me.setter
    def me(self, member: Member) -> None:
        self._me = member
        self._version += 1

    def __len__(self) -> int:
        """Members other than this node."""
        return len(self._members)

    @property
    def size(self) -> int:
        """N of the protocol's formulas: every member, this node included."""
        return len(self._members) + 1

    @property
    def suspicion_size(self) -> int:
        """`rules.suspicion_members` of this view, kept as members change (not counted anew
        for each suspicion: a view of thousands starts hundreds of them after a cut)."""
        return self.size - self._left

    def __iter__(self) -> Iterator[Member]:
        return iter(self._members.values())

    def get(self, node_id: str) -> Member | None:
        return self._members.get(node_id)

    def at(self, endpoint: Address) -> Member | None:
        node_id = self._endpoints().get(endpoint)
        return None if node_id is None else self._members.get(node_id)

    def _endpoints(self) -> dict[Address, str]:
        if self._by_endpoint is None:
            self._by_endpoint = {m.endpoint: node_id for node_id, m in self._members.items()}
        return self._by_endpoint

    def _indexes(self) -> dict[str, int]:
        if self._id_index is None:
            self._id_index = {node_id: index for index, node_id in enumerate(self._ids)}
        return self._id_index

    def store(self, previous: Member | None, member: Member) -> None:
        """Put `member` in place of `previous` (None: a new member)."""
        node_id = member.node_id
        self._members[node_id] = member
        self._version += 1
        self._left += (member.state is MemberState.LEFT) - (
            previous is not None and previous.state is MemberState.LEFT
        )
        if previous is None:
            if self._id_index is not None:
                self._id_index[node_id] = len(self._ids)
            self._ids.append(node_id)
            if self._probe_index < len(self._probe_order):
                self._probe_order.append(node_id)  # among those not drawn yet this round
        if previous is None or previous.endpoint != member.endpoint:
            by_endpoint = self._endpoints()
            if previous is not None and by_endpoint.get(previous.endpoint) == node_id:
                del by_endpoint[previous.endpoint]
            by_endpoint[member.endpoint] = node_id
        elif self._by_endpoint is not None:
            self._by_endpoint[member.endpoint] = node_id
        if member.state in UP:
            self.down_since.pop(node_id, None)
        elif previous is None or previous.state != member.state:
            self.down_since[node_id] = member.state_since

    def preload(self, members: Iterable[Member]) -> None:
        """Add every member of `members` not known yet (this node excepted) at once: a warm
        start, as if learned by push-pull, before the first probe round."""
        me = self._me.node_id
        known = self._members
        given = list(members)
        fresh = dict(zip(map(_NODE_ID, given), given, strict=True))
        if len(fresh) < len(given):  # an id twice: its first record counts
            fresh = {}
            for member in given:
                fresh.setdefault(member.node_id, member)
        fresh.pop(me, None)
        if known:
            fresh = {node_id: m for node_id, m in fresh.items() if node_id not in known}
        if not fresh:
            return
        distinct = self._by_endpoint is None or not self._by_endpoint
        if distinct:
            endpoints = set(map(_ENDPOINT, chain(known.values(), fresh.values())))
            distinct = len(endpoints) == len(known) + len(fresh)
        if not distinct or self._probe_order:
            for member in fresh.values():
                self.store(None, member)
            return
        known.update(fresh)
        self._ids.extend(fresh)
        states = list(map(_STATE, fresh.values()))
        self._left += states.count(MemberState.LEFT)
        self._id_index = None
        self._by_endpoint = None
        self._version += 1
        if states.count(MemberState.ALIVE) + states.count(MemberState.SUSPECT) < len(states):
            for node_id, member in fresh.items():
                if member.state not in UP:
                    self.down_since[node_id] = member.state_since

    def remove(self, node_id: str) -> Member:
        indexes = self._indexes()
        member = self._members.pop(node_id)
        self._version += 1
        self._left -= member.state is MemberState.LEFT
        index = indexes.pop(node_id)
        last = self._ids.pop()
        if last != node_id:
            self._ids[index] = last
            indexes[last] = index
        by_endpoint = self._by_endpoint
        if by_endpoint is not None and by_endpoint.get(member.endpoint) == node_id:
            del by_endpoint[member.endpoint]
        for table in (self.heard_at, self.down_since, self.synced_at):
            table.pop(node_id, None)
        return member

    def pick(
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

    def pick_relays(self, count: int, exclude: Container[str]) -> list[Member]:
        """Up to `count` alive members for a ping-req, the most recently heard from first (ties
        in random order): a member that just reached us is likely to reach us again, with a nack
        if not with an ack, while members silent since a partition cut them off are not. Large
        views choose among 8 * count random alive members."""
        if count <= 0:
            return []
        alive = (MemberState.ALIVE,)
        if len(self._ids) <= 4 * count + 16:
            pool = self.pick(len(self._ids), alive, exclude)
        else:
            pool = self.pick(8 * count, alive, exclude)
        pool.sort(key=lambda m: self.heard_at.get(m.node_id, -math.inf), reverse=True)
        return pool[:count]

    def next_probe_target(self) -> Member | None:
        """Round-robin over every member in an order drawn at random as the round goes (a lazy
        Fisher-Yates shuffle: O(1) a probe however large the view, and no N-long shuffle when
        thousands of views start at once), so each live member is probed once per round;
        members added mid-round join those not drawn yet.

        A suspect drawn gives its turn to an alive member not drawn yet and goes back among
        those: its suspicion already runs on a timer, so the probes go first to members nobody
        suspects yet (across a partition, the far side is covered sooner)."""
        for _ in range(len(self._probe_order) + 1):
            if self._probe_index >= len(self._probe_order):
                self._probe_order = list(self._ids)
                self._probe_index = 0
                if not self._probe_order:
                    return None
            self._draw()
            member = self._members.get(self._probe_order[self._probe_index])
            self._probe_index += 1
            if member is not None and member.state in UP:
                return member
        return None

    def _draw(self) -> None:
        """Put a random member not drawn yet at the probe index, an alive one rather than a
        suspect while one is left (looked for from a random place among the rest)."""
        order, index, rng = self._probe_order, self._probe_index, self._rng
        spot = rng.randrange(index, len(order))
        order[index], order[spot] = order[spot], order[index]
        current = self._members.get(order[index])
        if current is None or current.state != MemberState.SUSPECT:
            return
        rest = len(order) - index - 1
        start = rng.randrange(rest) if rest else 0
        for step in range(rest):
            later = index + 1 + (start + step) % rest
            member = self._members.get(order[later])
            if member is not None and member.state == MemberState.ALIVE:
                order[index], order[later] = order[later], order[index]
                return

    def digest(self) -> str:
        """`view_digest` of every member with this node, cached until the view changes."""
        if self._digest[0] != self._version:
            self._digest = (self._version, view_digest(chain([self._me], self._members.values())))
        return self._digest[1]

    def view(self, member: Member, now: float) -> MemberView:
        is_self = member.node_id == self._me.node_id
        heard = now if is_self else self.heard_at.get(member.node_id, member.state_since)
        refusal = self.refused.get(member.node_id)
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
            None if is_self or refusal is None else refusal.reason,
        )

    def views(self, now: float) -> list[MemberView]:
        """This node first, then every member by id."""
        others = sorted(self._members.values(), key=lambda m: m.node_id)
        return [self.view(member, now) for member in chain([self._me], others)]
