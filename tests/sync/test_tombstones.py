"""Tombstones without a network: which copy a tombstone deletes and which it loses to
(plan_deletions), their wire form, and their durable store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sync.cluster import cluster_stats_from_json
from sync.errors import FileSyncError, ManifestError
from sync.files.manifest import ManifestEntry
from sync.files.tombstones import (
    Tombstone,
    TombstoneStore,
    deletion_time_ns,
    parse_tombstones,
    plan_deletions,
    tombstone_etag,
)

H1 = "1" * 64
H2 = "2" * 64
SECOND = 10**9
TTL_S = 100.0


def _entry(path: str, digest: str, mtime_ns: int) -> ManifestEntry:
    return ManifestEntry(path, 5, mtime_ns, digest)


class FakeClock:
    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


def test_a_tombstone_deletes_only_its_version_no_newer_than_it() -> None:
    tomb = Tombstone("a.yaml", H1, "n1", 50 * SECOND)
    assert tomb.kills(_entry("a.yaml", H1, 10 * SECOND))
    assert tomb.kills(_entry("a.yaml", H1, 50 * SECOND))
    assert not tomb.kills(_entry("a.yaml", H2, 10 * SECOND))  # another content wins
    assert not tomb.kills(_entry("a.yaml", H1, 51 * SECOND))  # re-created after it wins
    assert not tomb.kills(_entry("b.yaml", H1, 10 * SECOND))


def test_plan_deletes_adopts_and_clears() -> None:
    now = 1000 * SECOND
    local = {
        "old.yaml": _entry("old.yaml", H1, 10 * SECOND),
        "other.yaml": _entry("other.yaml", H2, 10 * SECOND),
        "back.yaml": _entry("back.yaml", H1, 900 * SECOND),
    }
    theirs = [
        Tombstone("old.yaml", H1, "a", 500 * SECOND),
        Tombstone("other.yaml", H1, "a", 500 * SECOND),
        Tombstone("gone.yaml", H1, "a", 500 * SECOND),
    ]
    mine = {("back.yaml", H1): Tombstone("back.yaml", H1, "me", 800 * SECOND)}
    plan = plan_deletions(local, mine, theirs, now_ns=now, ttl_s=TTL_S * 10)
    assert [(entry.path, tomb.node_id) for entry, tomb in plan.delete] == [("old.yaml", "a")]
    assert {t.path for t in plan.adopt} == {"old.yaml", "other.yaml", "gone.yaml"}
    assert plan.clear == (("back.yaml", H1),)  # the file re-created at 900 s beat it
    offered = [
        _entry("old.yaml", H1, 10 * SECOND),
        _entry("gone.yaml", H1, 400 * SECOND),
        _entry("gone.yaml", H2, 400 * SECOND),
        _entry("back.yaml", H1, 10 * SECOND),
    ]
    kept = plan.surviving(offered)
    assert [(e.path, e.hash) for e in kept] == [("gone.yaml", H2), ("back.yaml", H1)]


def test_expired_tombstones_are_ignored() -> None:
    now = 1000 * SECOND
    local = {"old.yaml": _entry("old.yaml", H1, 10 * SECOND)}
    theirs = [Tombstone("old.yaml", H1, "a", now - int((TTL_S + 1) * SECOND))]
    plan = plan_deletions(local, {}, theirs, now_ns=now, ttl_s=TTL_S)
    assert (plan.delete, plan.adopt) == ((), ())
    fresh = [Tombstone("old.yaml", H1, "a", now - int((TTL_S - 1) * SECOND))]
    assert len(plan_deletions(local, {}, fresh, now_ns=now, ttl_s=TTL_S).delete) == 1


def test_a_later_tombstone_of_the_same_version_is_adopted() -> None:
    mine = {("x", H1): Tombstone("x", H1, "me", 10 * SECOND)}
    later = Tombstone("x", H1, "a", 20 * SECOND)
    plan = plan_deletions({}, mine, [later], now_ns=30 * SECOND, ttl_s=TTL_S)
    assert plan.adopt == (later,)
    assert (
        plan_deletions(
            {}, {("x", H1): later}, [mine[("x", H1)]], now_ns=30 * SECOND, ttl_s=TTL_S
        ).adopt
        == ()
    )


def test_deletion_time_follows_the_deleted_version() -> None:
    assert deletion_time_ns(_entry("x", H1, 5), 100) == 100
    assert deletion_time_ns(_entry("x", H1, 500), 100) == 501


def test_wire_form_round_trips_and_refuses_malformed() -> None:
    tomb = Tombstone("dir/a.yaml", H1, "n1", 123)
    assert parse_tombstones({"tombstones": [tomb.to_json()]}) == (tomb,)
    assert parse_tombstones({}) == ()
    bad = [
        {"tombstones": {}},
        {"tombstones": [{**tomb.to_json(), "path": "../x"}]},
        {"tombstones": [{**tomb.to_json(), "hash": "ABC"}]},
        {"tombstones": [{**tomb.to_json(), "deleted_at_ns": "1"}]},
        {"tombstones": [{**tomb.to_json(), "deleted_at_ns": True}]},
        {"tombstones": [{**tomb.to_json(), "node": 3}]},
        {"tombstones": ["x"]},
    ]
    for page in bad:
        with pytest.raises(ManifestError):
            parse_tombstones(page)


def test_the_etag_changes_with_the_tombstones() -> None:
    tomb = Tombstone("a", H1, "n1", 1)
    assert tombstone_etag("e", ()) == "e"
    assert tombstone_etag("e", (tomb,)) != "e"
    assert tombstone_etag("e", (tomb,)) != tombstone_etag("e", (Tombstone("a", H1, "n1", 2),))


async def test_store_is_durable_and_expires(tmp_path: Path) -> None:
    clock = FakeClock(1000 * SECOND)
    db = tmp_path / "tombstones.db"
    async with TombstoneStore(db, TTL_S, clock=clock) as store:
        made = await store.record_removed("configs", [_entry("a", H1, 10 * SECOND)], "me")
        assert [t.deleted_at_ns for t in made] == [1000 * SECOND]
        clock.now_ns += SECOND
        again = await store.record_removed("configs", [_entry("a", H1, 10 * SECOND)], "me")
        assert again == []  # the same deletion keeps its first tombstone
        rewritten = _entry("a", H1, 1000 * SECOND + 5)
        assert len(await store.record_removed("configs", [rewritten], "me")) == 1
        await store.set_last_sync("configs", 7)
    rows = sqlite3.connect(db).execute("SELECT path, deleted_at_ns FROM tombstones").fetchall()
    assert rows == [("a", 1001 * SECOND)]
    async with TombstoneStore(db, TTL_S, clock=clock) as store:
        assert [t.path for t in store.live("configs")] == ["a"]
        assert store.last_sync_ns("configs") == 7
        assert store.live("models") == ()
        clock.now_ns += int((TTL_S + 1) * SECOND)
        assert store.live("configs") == ()
        assert await store.purge_expired("configs") == 1
        assert store.held("configs") == {}
    assert sqlite3.connect(db).execute("SELECT count(*) FROM tombstones").fetchone() == (0,)


def test_the_python_api_reads_the_deletion_stats_of_a_run() -> None:
    stats = {
        "files_transferred": 0,
        "bytes_transferred": 0,
        "duration_seconds": 0.1,
        "errors": [],
        "deleted": 2,
        "stale_beyond_tombstone_ttl": True,
        "resurrected": 3,
    }
    answer = {"files": {"configs": stats}, "nodes_synced": 1, "failed_nodes": []}
    configs = cluster_stats_from_json(answer).category_stats["configs"]
    assert (configs.deleted, configs.stale_beyond_tombstone_ttl, configs.resurrected) == (
        2,
        True,
        3,
    )
    plain = {k: v for k, v in stats.items() if k in ("files_transferred", "bytes_transferred")}
    plain.update(duration_seconds=0.1, errors=[])  # a node without deletion stats
    older = {"files": {"configs": plain}, "nodes_synced": 1, "failed_nodes": []}
    assert cluster_stats_from_json(older).category_stats["configs"].deleted == 0


async def test_a_closed_store_refuses_writes_naming_itself(tmp_path: Path) -> None:
    db = tmp_path / "tombstones.db"
    store = TombstoneStore(db, TTL_S)
    await store.open()
    await store.set_last_sync("configs", 1)
    await store.close()
    await store.close()
    with pytest.raises(FileSyncError, match=r"tombstone store .*tombstones\.db is closed"):
        await store.set_last_sync("configs", 2)
