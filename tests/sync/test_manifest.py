"""Content hashes, manifest entries and pages, and the pure pull decisions."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from health import CircuitOpenError
from sync import (
    AllSourcesFailedError,
    FileTransferError,
    InsufficientSpaceError,
    ManifestError,
    PeerRef,
    plan_pulls,
)
from sync.files.manifest import ManifestEntry, content_hash, parse_entry, parse_page
from sync.files.plan import FallbackSources
from tests.sync.files_fixtures import hash_file

PIECE = 4096
A = PeerRef("a", "http://127.0.0.1:1")
B = PeerRef("b", "http://127.0.0.1:2")
C = PeerRef("c", "http://127.0.0.1:3")


def _entry(path: str, data: bytes, mtime_ns: int = 1, piece_size: int = PIECE) -> ManifestEntry:
    digests = [
        hashlib.sha256(data[i : i + piece_size]).digest()
        for i in range(0, max(1, len(data)), piece_size)
    ]
    pieces = tuple(d.hex() for d in digests) if len(digests) > 1 else ()
    return ManifestEntry(path, len(data), mtime_ns, content_hash(digests), pieces, piece_size)


@pytest.mark.parametrize("size", [0, 1, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE, 3 * PIECE + 7])
def test_hash_file_matches_the_definition(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    got_size, digest, pieces = hash_file(tmp_path / "f", PIECE)
    expected = _entry("f", data)
    assert (got_size, digest, pieces) == (size, expected.hash, expected.pieces)
    assert expected.piece_count == max(1, -(-size // PIECE))
    if size <= PIECE:
        assert digest == hashlib.sha256(data).hexdigest()  # what sha256sum prints
        assert pieces == ()


def test_entry_round_trips_through_json() -> None:
    entry = _entry("a/b.bin", os.urandom(3 * PIECE + 5), mtime_ns=123)
    assert parse_entry(entry.to_json(), PIECE) == entry
    small = _entry("c.txt", b"hello")
    assert parse_entry(small.to_json(), PIECE) == small


def _bad(entry: ManifestEntry, **changes: Any) -> dict[str, Any]:
    data = entry.to_json()
    data.update(changes)
    return data


BIG = _entry("big.bin", bytes(range(256)) * 64, mtime_ns=5)


@pytest.mark.parametrize(
    "data",
    [
        _bad(BIG, path="../escape"),
        _bad(BIG, path="/abs"),
        _bad(BIG, path=".shoal-partial-x"),
        _bad(BIG, path=7),
        _bad(BIG, size=True),
        _bad(BIG, size=-1),
        _bad(BIG, mtime_ns="1"),
        _bad(BIG, hash="XYZ"),
        _bad(BIG, hash=BIG.hash.upper()),
        _bad(BIG, pieces=list(BIG.pieces[:-1])),
        _bad(BIG, pieces=[*BIG.pieces[:-1], "0" * 64]),
        _bad(BIG, pieces="nope"),
        _bad(_entry("s", b"x"), pieces=["0" * 64]),
        "not an object",
    ],
)
def test_parse_entry_refuses_malformed_or_inconsistent_entries(data: Any) -> None:
    with pytest.raises(ManifestError):
        parse_entry(data, PIECE)


def test_parse_page_refuses_other_algorithms_and_piece_sizes() -> None:
    page = {"algorithm": "sha256", "piece_size": PIECE, "entries": [], "next": None}
    assert parse_page(page, PIECE).entries == ()
    with pytest.raises(ManifestError, match="same piece size"):
        parse_page(page, 2 * PIECE)
    with pytest.raises(ManifestError, match="hash"):
        parse_page({**page, "algorithm": "md5"})
    with pytest.raises(ManifestError):
        parse_page({**page, "next": 3})


def test_plan_pulls_new_and_newer_files_only() -> None:
    local = {
        "same": _entry("same", b"1", 10),
        "old": _entry("old", b"old", 10),
        "mine-newer": _entry("mine-newer", b"mine", 50),
    }
    remote = [
        _entry("same", b"1", 99),
        _entry("old", b"new", 20),
        _entry("mine-newer", b"theirs", 40),
        _entry("fresh", b"fresh", 1),
    ]
    plan = plan_pulls(local, [(A, remote)])
    assert [(item.entry.path, item.replaces) for item in plan] == [
        ("fresh", None),
        ("old", local["old"].hash),
    ]
    assert all(item.sources == (A,) for item in plan)


def test_plan_pulls_newest_version_from_its_holders() -> None:
    v1, v2 = _entry("f", b"one", 10), _entry("f", b"two", 20)
    plan = plan_pulls({}, [(A, [v1]), (B, [v2]), (C, [_entry("f", b"two", 15)])])
    assert len(plan) == 1
    assert plan[0].entry.hash == v2.hash
    assert plan[0].sources == (B, C)


def test_plan_pulls_breaks_mtime_ties_by_hash_on_every_node() -> None:
    x, y = _entry("f", b"x", 10), _entry("f", b"y", 10)
    winner = max(x, y, key=lambda e: e.hash)
    assert plan_pulls({}, [(A, [x]), (B, [y])])[0].entry.hash == winner.hash
    assert plan_pulls({}, [(B, [y]), (A, [x])])[0].entry.hash == winner.hash
    loser = x if winner is y else y
    assert plan_pulls({"f": winner}, [(A, [loser])]) == []


async def test_fallback_tries_primary_then_fallbacks() -> None:
    tried: list[str] = []

    async def attempt(peer: PeerRef) -> str:
        tried.append(peer.node_id)
        if peer is A:
            raise FileTransferError("down")
        if peer is B:
            raise CircuitOpenError("b/http", 5.0)
        return peer.node_id

    assert await FallbackSources(A, (B, A, C), 5.0).run("f", attempt) == "c"
    assert tried == ["a", "b", "c"]


async def test_fallback_stops_on_local_errors_and_reports_every_source() -> None:
    async def no_space(peer: PeerRef) -> None:
        raise InsufficientSpaceError("/d", 10, 1, 5)

    with pytest.raises(InsufficientSpaceError):
        await FallbackSources(A, (B,), 5.0).run("f", no_space)

    async def failing(peer: PeerRef) -> None:
        raise FileTransferError(f"{peer.node_id} down")

    with pytest.raises(AllSourcesFailedError) as caught:
        await FallbackSources(A, (B,), 5.0).run("f", failing)
    assert [peer for peer, _ in caught.value.errors] == ["a", "b"]


async def test_fallback_gives_up_when_time_runs_out() -> None:
    async def slow(peer: PeerRef) -> None:
        await asyncio.sleep(10)

    with pytest.raises(AllSourcesFailedError, match="every source failed"):
        await FallbackSources(A, (B,), 0.05).run("f", slow)
