"""Piece maps and rarest-first selection, without sockets: which piece a puller asks for next,
from whom, and when the origin is asked."""

from __future__ import annotations

import pytest

from sync import Limits, ManifestError, PieceMap, choose_pieces
from sync.files.manifest import ManifestEntry
from sync.files.pieces import decode_bitfield, encode_bitfield, spread_start, stripe_of

PIECE = 16 << 10
HASH = "ab" * 32
ORIGIN = "origin"


def _map(have: set[int], pending: set[int] = frozenset(), uploads: int = 0) -> PieceMap:  # type: ignore[assignment]
    return PieceMap("m.bin", HASH, 10 * PIECE, PIECE, frozenset(have), frozenset(pending), uploads)


def test_bitfield_round_trip_and_refusals() -> None:
    assert encode_bitfield([0, 9], 10) == "8040"
    assert decode_bitfield("8040", 10) == {0, 9}
    assert decode_bitfield(encode_bitfield(range(17), 17), 17) == set(range(17))
    with pytest.raises(ValueError, match="bytes for"):
        decode_bitfield("80", 10)
    with pytest.raises(ValueError, match="sets piece 10"):
        decode_bitfield("8020", 10)
    with pytest.raises(ValueError, match="hex"):
        decode_bitfield("zz00", 10)


def test_piece_map_json_round_trip_and_another_file_refused() -> None:
    entry = ManifestEntry("m.bin", 10 * PIECE, 1, HASH, tuple("cd" * 32 for _ in range(10)), PIECE)
    held = _map({1, 2, 3}, {4}, uploads=2)
    assert PieceMap.from_json(held.to_json(), entry) == held
    assert held.to_json()["piece_count"] == 10
    assert held.to_json()["complete"] is False
    other = {**held.to_json(), "size": 9 * PIECE}
    with pytest.raises(ManifestError, match="expected"):
        PieceMap.from_json(other, entry)


def test_rarest_piece_first_from_the_least_loaded_holder() -> None:
    maps = {
        "a": _map({0, 1, 2}),
        "b": _map({0, 1}),
        "c": _map({0, 1}, uploads=3),
    }
    picks = choose_pieces(
        [0, 1, 2], maps, {}, origin=ORIGIN, count=10, limits=Limits(per_peer=1, origin=1, total=1)
    )
    assert picks == [(2, "a")]  # piece 2 has one holder; pieces 0 and 1 three
    picks = choose_pieces(
        [0, 1], maps, {"a": 1}, origin=ORIGIN, count=10, limits=Limits(per_peer=2, total=3)
    )
    # a serves one of ours already and c three uploads of others': b first; then b and a
    # serve one of ours each, and c none of ours: c
    assert picks == [(0, "b"), (1, "c")]


def test_origin_only_for_pieces_no_peer_holds_and_nobody_fetches() -> None:
    maps = {"a": _map({0}, pending={1})}
    limits = Limits(per_peer=2, origin=2, total=8)
    picks = choose_pieces([0, 1, 2], maps, {}, origin=ORIGIN, count=10, limits=limits)
    assert sorted(picks) == [(0, "a"), (2, ORIGIN)]  # 1 is coming to a: wait for it
    waited = choose_pieces([1], maps, {}, origin=ORIGIN, count=10, limits=limits, use_pending=True)
    assert waited == [(1, ORIGIN)]
    # a busy holder is waited for, never replaced by the origin
    busy = choose_pieces([0], maps, {"a": 2}, origin=ORIGIN, count=10, limits=limits)
    assert busy == []


def test_limits_per_peer_origin_and_total() -> None:
    maps = {"a": _map(set(range(10)))}
    picks = choose_pieces(
        range(10), maps, {}, origin=ORIGIN, count=10, limits=Limits(per_peer=3, total=8)
    )
    assert len(picks) == 3
    assert {peer for _, peer in picks} == {"a"}
    nobody = choose_pieces(
        range(10), {}, {}, origin=ORIGIN, count=10, limits=Limits(origin=2, total=8)
    )
    assert len(nobody) == 2
    full = choose_pieces(
        range(10), maps, {"a": 1, ORIGIN: 1}, origin=ORIGIN, count=10, limits=Limits(total=2)
    )
    assert full == []


def test_origin_is_never_counted_as_a_holder_and_ties_start_at_the_spread() -> None:
    maps = {ORIGIN: _map(set(range(10)))}
    picks = choose_pieces(
        range(10), maps, {}, origin=ORIGIN, count=10, start=7, limits=Limits(origin=2)
    )
    assert picks == [(7, ORIGIN), (8, ORIGIN)]


def test_pullers_start_at_different_pieces() -> None:
    members = ["origin", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8"]
    starts = [spread_start(node, members, 16) for node in members[1:]]
    assert len(set(starts)) == 8


def test_few_pieces_at_a_time_come_from_the_origin_to_the_whole_swarm() -> None:
    maps = {"a": _map({0}, pending={1}), "b": _map(set(), pending={2, 0})}
    limits = Limits(per_peer=2, origin=2, total=8, origin_shared=2)
    # pieces 1 and 2 are on their way from the origin (nobody holds them): wait
    waiting = choose_pieces([3, 4, 5], maps, {}, origin=ORIGIN, count=10, limits=limits)
    assert waiting == []
    roomy = Limits(per_peer=2, origin=2, total=8, origin_shared=3)
    one = choose_pieces([3, 4, 5], maps, {}, origin=ORIGIN, count=10, limits=roomy)
    assert one == [(3, ORIGIN)]
    late = choose_pieces(
        [3, 4, 5], maps, {}, origin=ORIGIN, count=10, limits=limits, use_pending=True
    )
    assert late == [(3, ORIGIN), (4, ORIGIN)]


def test_pullers_blind_to_each_other_never_ask_the_origin_for_the_same_piece() -> None:
    """Each puller takes its own stripe of the pieces nobody holds first: before their piece
    maps reach each other, 4 pullers of 8 pieces ask the origin for 8 different pieces."""
    pullers = ["p1", "p2", "p3", "p4"]
    members = [ORIGIN, *pullers]
    asked: list[int] = []
    for node in pullers:
        start = spread_start(node, members, 8)
        stripe = stripe_of(node, [p for p in pullers if p != node])
        wanted = set(range(8))
        for _ in range(2):  # one piece at a time, its own map of the others still empty
            (index, peer), *_ = choose_pieces(
                wanted, {}, {}, origin=ORIGIN, count=8, start=start, stripe=stripe
            )
            assert peer == ORIGIN
            wanted.discard(index)
            asked.append(index)
    assert sorted(asked) == list(range(8))


def test_a_piece_of_a_pulling_members_stripe_is_left_to_it() -> None:
    """A puller done with its own stripe leaves the origin's pieces of another puller's stripe
    to that puller while its map shows it pulling (its request may not show yet), and takes
    them when that member holds and fetches nothing of the file, or after waiting."""
    stripe = stripe_of("p1", ["p2"])  # p1: even pieces, p2: odd ones
    pulling = {"p2": _map(set(), pending={1})}
    picks = choose_pieces([3], pulling, {}, origin=ORIGIN, count=10, stripe=stripe)
    assert picks == []
    assert choose_pieces([3], {}, {}, origin=ORIGIN, count=10, stripe=stripe) == [(3, ORIGIN)]
    late = choose_pieces([3], pulling, {}, origin=ORIGIN, count=10, stripe=stripe, use_pending=True)
    assert late == [(3, ORIGIN)]
