"""The member table's warm start (`preload`) and its lazily built indexes answer exactly as a
table that stored every member one by one: lookups by address, removal, random picks."""

from __future__ import annotations

import random

from node.membership.rules import suspicion_members
from node.membership.table import MemberTable
from node.membership.types import Member, MemberState


def _member(
    index: int, *, host: int | None = None, state: MemberState = MemberState.ALIVE
) -> Member:
    return Member(f"n{index:03d}", f"10.0.0.{host if host is not None else index}", 7000, state, 0)


def _tables(members: list[Member]) -> tuple[MemberTable, MemberTable]:
    me = _member(999, host=250)
    stored, preloaded = MemberTable(me, random.Random(5)), MemberTable(me, random.Random(5))
    for member in members:
        if stored.get(member.node_id) is None and member.node_id != me.node_id:
            stored.store(None, member)
    preloaded.preload(members)
    return stored, preloaded


def _same(stored: MemberTable, preloaded: MemberTable, hosts: range) -> None:
    assert list(stored) == list(preloaded)
    assert stored.down_since == preloaded.down_since
    assert stored.digest() == preloaded.digest()
    for host in hosts:
        found = stored.at((f"10.0.0.{host}", 7000))
        assert found == preloaded.at((f"10.0.0.{host}", 7000)), host
    picks = [m.node_id for m in stored.pick(5, (MemberState.ALIVE,))]
    assert picks == [m.node_id for m in preloaded.pick(5, (MemberState.ALIVE,))]


def test_a_preloaded_table_answers_as_one_stored_member_by_member() -> None:
    members = [_member(i) for i in range(60)] + [_member(3), _member(61, state=MemberState.DEAD)]
    stored, preloaded = _tables(members)
    assert preloaded.get("n003") is members[3]  # the first record of an id wins
    assert preloaded.down_since == {"n061": members[-1].state_since}
    _same(stored, preloaded, range(70))


def test_lazy_indexes_follow_moves_removals_and_shared_addresses() -> None:
    stored, preloaded = _tables([_member(i) for i in range(40)])
    for table in (stored, preloaded):
        table.store(table.get("n005"), _member(5, host=7))  # n005 moves onto n007's address
        table.store(None, _member(41, host=9))  # a newcomer shares n009's address
        table.store(table.get("n012"), _member(12, state=MemberState.DEAD))
        table.remove("n020")
        table.remove("n007")
    _same(stored, preloaded, range(45))
    assert preloaded.at(("10.0.0.7", 7000)) is preloaded.get("n005")
    assert preloaded.at(("10.0.0.9", 7000)) is preloaded.get("n041")
    assert preloaded.get("n020") is None
    assert len(preloaded) == len(stored) == 39


def test_preload_with_shared_addresses_keeps_the_last_stored_owner() -> None:
    members = [_member(i) for i in range(10)] + [_member(10, host=4)]
    stored, preloaded = _tables(members)
    assert preloaded.at(("10.0.0.4", 7000)) is members[-1]
    _same(stored, preloaded, range(12))


def test_the_suspicion_size_is_kept_as_members_leave_return_and_go() -> None:
    members = [_member(i) for i in range(20)] + [_member(20, state=MemberState.LEFT)]
    stored, preloaded = _tables(members)
    for table in (stored, preloaded):
        table.store(table.get("n003"), _member(3, state=MemberState.LEFT))
        table.store(table.get("n020"), _member(20))  # back from a leave
        table.store(table.get("n004"), _member(4, state=MemberState.LEFT))
        table.remove("n004")
        table.store(table.get("n005"), _member(5, state=MemberState.DEAD))
        assert table.suspicion_size == suspicion_members(m.state for m in table) == 20
