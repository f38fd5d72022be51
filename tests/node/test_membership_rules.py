"""The decisions of the membership protocol, as pure functions: no sockets, no event loop."""

from __future__ import annotations

import math
import random

import pytest

from node.errors import MembershipError
from node.membership.gossip import GossipQueue
from node.membership.rules import (
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
    supersedes,
    suspicion_bounds_s,
    suspicion_timeout_s,
    sync_interval_s,
    view_digest,
)
from node.membership.table import MemberTable
from node.membership.types import (
    EventKind,
    Member,
    MemberState,
    SwimTuning,
    Update,
    freeze_meta,
    validate_node_id,
)

A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


def member(state: MemberState = A, incarnation: int = 3, **changes: object) -> Member:
    fields: dict[str, object] = {
        "node_id": "n1",
        "address": "10.0.0.1",
        "port": 7000,
        "state": state,
        "incarnation": incarnation,
        "meta": freeze_meta({"role": "training"}),
        "state_since": 5.0,
    }
    fields.update(changes)
    return Member(**fields)  # type: ignore[arg-type]


def alive(incarnation: int, address: str = "10.0.0.1", **meta: object) -> Update:
    return Update("n1", A, incarnation, address, 7000, freeze_meta(meta or {"role": "training"}))


@pytest.mark.parametrize(
    ("new", "old", "wins"),
    [
        ((A, 4), (A, 3), True),
        ((A, 3), (A, 3), False),
        ((A, 3), (S, 3), False),  # alive(i) beats suspect(j) only when i > j
        ((A, 4), (S, 3), True),
        ((S, 3), (A, 3), True),  # suspect(i) beats alive(j) when i >= j
        ((S, 2), (A, 3), False),
        ((S, 3), (S, 3), False),
        ((D, 3), (S, 3), True),
        ((D, 3), (A, 3), True),
        ((D, 2), (A, 3), False),  # a stale death does not kill a refuted member
        ((A, 3), (D, 3), False),  # dead stays dead ...
        ((A, 4), (D, 3), True),  # ... until it comes back with a higher incarnation
        ((L, 3), (A, 3), True),
        ((L, 3), (D, 3), True),
        ((D, 3), (L, 3), False),
        ((A, 4), (L, 3), True),  # a member that left rejoins with a higher incarnation
    ],
)
def test_precedence_orders_by_incarnation_then_state(
    new: tuple[MemberState, int], old: tuple[MemberState, int], wins: bool
) -> None:
    assert supersedes(*new, *old) is wins


def test_alive_update_adds_unknown_member_and_gossips_it() -> None:
    outcome = merge_remote(None, alive(0), 9.0, from_sync=False)
    assert outcome.member is not None
    assert outcome.member.endpoint == ("10.0.0.1", 7000)
    assert outcome.event == EventKind.JOINED
    assert outcome.gossip


def test_sync_record_adds_member_without_gossip_storm() -> None:
    outcome = merge_remote(None, alive(0), 9.0, from_sync=True)
    assert outcome.event == EventKind.JOINED
    assert not outcome.gossip


def test_a_member_first_heard_without_meta_takes_it_from_its_own_record() -> None:
    """A placeholder (alive, incarnation 0, no meta: the sender of a message that carried no
    record of itself) takes the meta of the record at the same incarnation; nothing else does."""
    placeholder = member(A, 0, meta=freeze_meta({}))
    outcome = merge_remote(placeholder, alive(0, protocol=2), 9.0, from_sync=True)
    assert outcome.member is not None
    assert dict(outcome.member.meta) == {"protocol": 2}
    assert (outcome.member.state, outcome.member.incarnation) == (A, 0)
    assert outcome.event == EventKind.UPDATED
    assert not outcome.gossip
    assert merge_remote(member(A, 0), alive(0, protocol=2), 9.0, from_sync=True).member is None
    moved = alive(0, "10.0.0.9", protocol=2)
    assert merge_remote(placeholder, moved, 9.0, from_sync=True).member is None
    suspect = Update("n1", S, 0, "10.0.0.1", 7000, freeze_meta({"protocol": 2}), by="n2")
    outcome = merge_remote(placeholder, suspect, 9.0, from_sync=False)
    assert outcome.member is not None
    assert outcome.member.state == S


def test_updates_without_address_about_unknown_members_are_ignored() -> None:
    assert merge_remote(None, Update("n1", S, 0, by="n2"), 1.0, from_sync=False).member is None
    assert merge_remote(None, Update("n1", D, 0), 1.0, from_sync=False).member is None


def test_suspect_then_refutation() -> None:
    current = member(A, 3)
    suspected = merge_remote(current, Update("n1", S, 3, by="n2"), 9.0, from_sync=False)
    assert suspected.member is not None
    assert suspected.member.state == S
    assert suspected.member.state_since == 9.0
    assert suspected.event == EventKind.SUSPECT
    assert suspected.member.meta == current.meta
    refuted = merge_remote(suspected.member, alive(4), 10.0, from_sync=False)
    assert refuted.member is not None
    assert refuted.member.state == A
    assert refuted.event == EventKind.ALIVE


def test_meta_change_is_an_updated_event_and_a_bare_refutation_is_silent() -> None:
    changed = merge_remote(member(A, 3), alive(4, role="inference"), 9.0, from_sync=False)
    assert changed.event == EventKind.UPDATED
    same = merge_remote(member(A, 3), alive(4), 9.0, from_sync=False)
    assert same.event is None
    assert same.gossip


def test_sync_gossips_only_state_changes() -> None:
    assert merge_remote(member(A, 3), alive(4), 1.0, from_sync=True).gossip is False
    assert merge_remote(member(S, 3), alive(4), 1.0, from_sync=True).gossip is True


def test_dead_in_a_full_state_only_makes_us_suspect() -> None:
    record = from_sync(Update("n1", D, 3, "10.0.0.1", 7000), "n7")
    assert record.state == S
    assert record.by == "n7"
    assert from_sync(alive(3), "n7") == alive(3)


def test_member_coming_back_at_a_new_address_after_death_is_no_conflict() -> None:
    outcome = merge_remote(member(D, 3), alive(4, "10.0.0.9"), 1.0, from_sync=False)
    assert outcome.member is not None
    assert outcome.member.endpoint == ("10.0.0.9", 7000)
    assert outcome.conflict is None
    assert outcome.member.previous_address is None


def test_id_flipping_between_two_live_addresses_is_a_conflict() -> None:
    moved = merge_remote(member(A, 3), alive(4, "10.0.0.9"), 1.0, from_sync=False).member
    assert moved is not None
    assert moved.previous_address == ("10.0.0.1", 7000)
    back = merge_remote(moved, alive(5, "10.0.0.1"), 2.0, from_sync=False)
    assert back.conflict == ("10.0.0.9", 7000)
    assert back.member is not None
    assert back.member.conflict == ("10.0.0.9", 7000)


def test_confirmation_is_another_members_suspicion_at_the_same_incarnation() -> None:
    suspect = member(S, 3)
    assert is_confirmation(suspect, Update("n1", S, 3, by="n2"), "me")
    assert not is_confirmation(suspect, Update("n1", S, 3, by="me"), "me")
    assert not is_confirmation(suspect, Update("n1", S, 2, by="n2"), "me")
    assert not is_confirmation(member(A, 3), Update("n1", S, 3, by="n2"), "me")


def test_self_refutes_suspicion_and_death_with_a_higher_incarnation() -> None:
    me = member(A, 3)
    outcome = merge_self(me, Update("n1", S, 3, by="n2"), leaving=False, refuted={})
    assert outcome.refute_to == 4
    assert outcome.suspected
    assert merge_self(me, Update("n1", D, 7), leaving=False, refuted={}).refute_to == 8
    assert merge_self(me, Update("n1", S, 2), leaving=False, refuted={}).refute_to is None
    assert merge_self(me, Update("n1", L, 3), leaving=True, refuted={}).refute_to is None
    assert merge_self(me, Update("n1", L, 3), leaving=False, refuted={}).refute_to == 4


def test_self_refutes_a_stale_record_of_an_earlier_life() -> None:
    me = member(A, 0)
    assert merge_self(me, alive(5), leaving=False, refuted={}).refute_to == 6
    assert merge_self(me, alive(0, role="old"), leaving=False, refuted={}).refute_to == 1
    assert merge_self(me, alive(0), leaving=False, refuted={}).refute_to is None


def test_self_claimed_at_another_address_is_refuted_then_a_conflict() -> None:
    me = member(A, 2)
    other = ("10.0.0.9", 7000)
    first = merge_self(me, alive(2, "10.0.0.9"), leaving=False, refuted={})
    assert first.refute_to == 3
    assert first.foreign == other
    assert not first.conflict  # may be a stale record of our own earlier address
    again = merge_self(member(A, 3), alive(4, "10.0.0.9"), leaving=False, refuted={other: 3})
    assert again.conflict  # the other claimant raised its incarnation past our refutation
    stale = merge_self(member(A, 3), alive(1, "10.0.0.9"), leaving=False, refuted={other: 3})
    assert stale.refute_to is None


def test_suspicion_timeout_shrinks_with_confirmations() -> None:
    low, high = suspicion_bounds_s(1.0, 8, 3.0)
    assert (low, high) == (1.0, 3.0)
    assert suspicion_bounds_s(1.0, 1000, 3.0)[0] == pytest.approx(3.0)
    assert suspicion_timeout_s(0, 3, low, high) == high
    timeouts = [suspicion_timeout_s(c, 3, low, high) for c in range(5)]
    assert timeouts == sorted(timeouts, reverse=True)
    assert timeouts[3] == timeouts[4] == low
    assert suspicion_timeout_s(0, 0, low, high) == low
    assert expected_confirmations(3, 2) == 0
    assert expected_confirmations(3, 4) == 2
    assert expected_confirmations(3, 100) == 3
    # After our own failed probe: only the relays that nacked (the rest are cut off from us).
    assert expected_confirmations(3, 5, nacks=1) == 1  # a 2|3 split seen from the two
    assert expected_confirmations(3, 5, nacks=3) == 3
    assert expected_confirmations(3, 100, nacks=0) == 3  # no nack: maybe we are the slow one
    assert expected_confirmations(3, 4, nacks=3) == 2


def test_suspicion_counts_distinct_confirmers_but_not_its_origin() -> None:
    suspicion = Suspicion("n1", 3, 10.0, "n2", frozenset(), 3, 1.0, 3.0)
    assert suspicion.deadline == 13.0
    assert suspicion.confirmed_by("n2") is suspicion
    once = suspicion.confirmed_by("n3")
    assert once.confirmed_by("n3") is once
    full = once.confirmed_by("n4").confirmed_by("n5")
    assert full.deadline == 11.0
    assert 11.0 < once.deadline < 13.0


def test_local_health_rises_when_we_miss_acks_and_heals_on_acks() -> None:
    assert health_delta(ProbeResult.ACKED, 0, 0) == -1
    assert health_delta(ProbeResult.INDIRECT_ACKED, 3, 0) == 0
    assert health_delta(ProbeResult.FAILED, 3, 3) == 0  # relays reached us: the target is gone
    assert health_delta(ProbeResult.FAILED, 3, 0) == 1  # no relay's nack reached us: maybe slow
    assert (
        health_delta(ProbeResult.FAILED, 3, 1) == 0
    )  # one did: the others are cut off (partition)
    assert health_delta(ProbeResult.FAILED, 0, 0) == 1
    assert health_delta(ProbeResult.DISCOUNTED, 3, 0) == 0
    assert apply_health(7, 3, 8) == 8
    assert apply_health(0, -1, 8) == 0
    assert scaled_s(0.3, 0) == pytest.approx(0.3)
    assert scaled_s(0.3, 2) == pytest.approx(0.9)


def test_timeouts_overlapping_a_stall_do_not_count() -> None:
    stalls = [(10.0, 11.0)]
    assert overlaps_stall(stalls, 10.5, 11.2)
    assert overlaps_stall(stalls, 9.0, 10.1)
    assert not overlaps_stall(stalls, 11.0, 12.0)
    assert not overlaps_stall(stalls, 8.0, 10.0)
    assert stall_threshold_s(0.3, 0.05) == pytest.approx(0.15)
    assert stall_threshold_s(0.02, 0.05) == pytest.approx(0.05)


def test_gossip_and_sync_budgets_grow_with_log_n() -> None:
    assert retransmit_limit(4, 1) == 4
    assert retransmit_limit(4, 8) == 4
    assert retransmit_limit(4, 100) == 12
    assert retransmit_limit(4, 1000) == 16
    assert sync_interval_s(0.5, 10, 8) == 5.0
    assert sync_interval_s(0.5, 10, 1000) == 30.0


def test_reap_and_digest() -> None:
    assert reap_due({"a": 0.0, "b": 250.0}, 300.0, 300.0) == ["a"]
    one = [member(A, 1), member(A, 2, node_id="n2")]
    assert view_digest(one) == view_digest(list(reversed(one)))
    assert view_digest(one) != view_digest([member(S, 1), member(A, 2, node_id="n2")])


def test_a_view_missing_a_members_meta_differs_so_push_pull_brings_it() -> None:
    """A placeholder (alive, no meta) marks the digest: a peer knowing the meta sees a different
    view and sends its state, whose record fills the meta (CI: a new node kept an old node's
    release unknown for 60 s while every other part of the views matched)."""
    known = [member(A, 0), member(A, 2, node_id="n2")]
    placeholder = [member(A, 0, meta=freeze_meta({})), member(A, 2, node_id="n2")]
    assert view_digest(placeholder) != view_digest(known)
    assert view_digest(placeholder) == view_digest(list(reversed(placeholder)))
    dead = [member(D, 0, meta=freeze_meta({})), member(A, 2, node_id="n2")]
    assert view_digest(dead) == view_digest([member(D, 0), member(A, 2, node_id="n2")])


def test_gossip_queue_sends_least_sent_first_and_forgets_after_limit() -> None:
    queue = GossipQueue()
    queue.push("a", b"A" * 10)
    queue.push("b", b"B" * 10)
    assert queue.take(100, 10, limit=2) == [b"B" * 10, b"A" * 10]
    queue.push("c", b"C" * 10)
    assert queue.take(100, 1, limit=2) == [b"C" * 10]
    assert queue.take(100, 10, limit=2) == [b"C" * 10, b"B" * 10, b"A" * 10]
    assert queue.take(100, 10, limit=2) == []
    assert len(queue) == 0


def test_gossip_queue_replaces_per_member_and_respects_the_byte_budget() -> None:
    queue = GossipQueue()
    queue.push("a", b"old")
    queue.push("a", b"new")
    queue.push("b", b"x" * 50)
    assert queue.take(10, 10, limit=5) == [b"new"]
    assert queue.take(100, 10, limit=5, exclude={"b"}) == [b"new"]


def test_meta_and_ids_are_checked() -> None:
    assert dict(freeze_meta({"gpu_count": 8, "ok": True, "x": None, "f": 1.5})) == {
        "gpu_count": 8,
        "ok": True,
        "x": None,
        "f": 1.5,
    }
    with pytest.raises(MembershipError):
        freeze_meta({"bad": [1, 2]})
    with pytest.raises(MembershipError):
        freeze_meta({"nan": math.nan})
    with pytest.raises(MembershipError):
        validate_node_id("")
    with pytest.raises(MembershipError):
        SwimTuning(suspicion_max_mult=0.5)


def test_relays_are_the_alive_members_heard_from_most_recently() -> None:
    me = member(node_id="me", address="10.0.0.100")
    table = MemberTable(me, random.Random(1))
    for index, state in enumerate([A, A, A, A, A, S, A]):
        table.store(None, member(state, node_id=f"n{index}", address=f"10.0.0.{index}"))
    table.heard_at.update({"n0": 1.0, "n1": 9.0, "n2": 2.0, "n3": 8.0, "n4": 7.0, "n5": 10.0})
    # n5 is suspect, n6 never heard from, n3 the probe's target
    assert [m.node_id for m in table.pick_relays(3, {"n3"})] == ["n1", "n4", "n2"]
    assert [m.node_id for m in table.pick_relays(10, {"n3"})][-1] == "n6"
    assert table.pick_relays(0, ()) == []
    big = MemberTable(me, random.Random(2))
    for index in range(200):
        big.store(None, member(node_id=f"m{index}", address=f"10.0.1.{index}"))
        big.heard_at[f"m{index}"] = float(index % 50)
    relays = big.pick_relays(3, ())
    assert len({m.node_id for m in relays}) == 3
    heard = [big.heard_at[m.node_id] for m in relays]
    assert heard == sorted(heard, reverse=True)


def test_a_suspect_is_probed_after_the_alive_members_of_its_round() -> None:
    table = MemberTable(member(node_id="me", address="10.0.0.100"), random.Random(3))
    states = {"n0": S, "n1": A, "n2": D, "n3": A, "n4": S, "n5": A}
    for index, (node_id, state) in enumerate(states.items()):
        table.store(None, member(state, node_id=node_id, address=f"10.0.0.{index}"))
    for _ in range(3):  # every round: each member up probed once, the suspects last
        probed = [target.node_id for target in (table.next_probe_target() for _ in range(5))]
        assert sorted(probed[:3]) == ["n1", "n3", "n5"], probed
        assert sorted(probed[3:]) == ["n0", "n4"], probed
