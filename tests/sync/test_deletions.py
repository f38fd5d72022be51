"""Deletions between real nodes: a `propagate` category carries them by tombstones (also
through a third node, and never back from a lagging peer), a `keep` category does not; a
re-created file and another content win; tombstones expire; a node away longer than the TTL
says so; a crash between storing a tombstone and deleting the copy is finished later."""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sync.files.deletions as deletions_module
from sync.errors import FileSyncError
from sync.files.deletions import delete_copy
from sync.files.manifest import ManifestEntry
from sync.files.manifest_cache import ManifestCache, stat_key
from sync.files.tombstones import Tombstone, TombstoneStore
from tests.sync.files_fixtures import PIECE, FileNode

PROPAGATE = {"configs": "propagate", "models": "keep"}
SECOND = 10**9
TTL_S = 3600.0


class FakeClock:
    """Wall clock in ns, moved by tests (starts at the real time: files get real mtimes)."""

    def __init__(self) -> None:
        self.now_ns = time.time_ns()

    def __call__(self) -> int:
        return self.now_ns


def _node(base: Path, name: str, clock: FakeClock | None = None) -> FileNode:
    return FileNode(
        base / name,
        name,
        deletions=PROPAGATE,  # type: ignore[arg-type]
        clock=clock or time.time_ns,
        tombstone_ttl_s=TTL_S,
    )


def _store(node: FileNode) -> TombstoneStore:
    assert node.catalog.tombstones is not None
    return node.catalog.tombstones


async def test_a_deletion_propagates_through_peers_and_is_not_pulled_back(
    tmp_path: Path,
) -> None:
    async with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b, _node(tmp_path, "c") as c:
        a.write("x.yaml", b"lr: 1", category="configs")
        a.write("keep.yaml", b"lr: 2", category="configs")
        for node in (b, c):
            stats = await node.sync.sync("configs", [a.peer])
            assert (stats.files_transferred, stats.errors) == (2, ())
        (a.root("configs") / "x.yaml").unlink()
        stats = await b.sync.sync("configs", [a.peer])
        assert (stats.deleted, stats.files_transferred, stats.errors) == (1, 0, ())
        assert not (b.root("configs") / "x.yaml").exists()
        assert (b.root("configs") / "keep.yaml").exists()
        [tomb] = _store(a).live("configs")
        assert (tomb.path, tomb.node_id) == ("x.yaml", "a")
        assert _store(b).live("configs") == (tomb,)  # b serves it on
        # a still lagging peer offers the file: neither a nor b pulls it back
        for node in (a, b):
            again = await node.sync.sync("configs", [c.peer])
            assert (again.files_transferred, again.errors) == (0, ())
            assert not (node.root("configs") / "x.yaml").exists()
        third = await c.sync.sync("configs", [b.peer])  # from b, which only adopted it
        assert third.deleted == 1
        assert not (c.root("configs") / "x.yaml").exists()
        assert (c.root("configs") / "keep.yaml").exists()


async def test_keep_never_propagates_a_deletion(tmp_path: Path) -> None:
    async with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b:
        a.write("ckpt.pt", b"weights", category="models")
        assert (await b.sync.sync("models", [a.peer])).files_transferred == 1
        (a.root("models") / "ckpt.pt").unlink()
        stats = await b.sync.sync("models", [a.peer])
        assert (stats.deleted, stats.errors) == (0, ())
        assert (b.root("models") / "ckpt.pt").read_bytes() == b"weights"
        back = await a.sync.sync("models", [b.peer])  # today's behaviour: copied back
        assert back.files_transferred == 1
        assert _store(a).live("models") == ()


async def test_a_file_recreated_after_its_tombstone_wins(tmp_path: Path) -> None:
    async with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b:
        a.write("x.yaml", b"v1", category="configs", mtime_ns=time.time_ns() - 100 * SECOND)
        await b.sync.sync("configs", [a.peer])
        (a.root("configs") / "x.yaml").unlink()
        assert (await b.sync.sync("configs", [a.peer])).deleted == 1
        [tomb] = _store(a).live("configs")
        # the same content written again, after the deletion
        b.write("x.yaml", b"v1", category="configs", mtime_ns=tomb.deleted_at_ns + SECOND)
        stats = await b.sync.sync("configs", [a.peer])
        assert (stats.deleted, stats.errors) == (0, ())
        assert (b.root("configs") / "x.yaml").read_bytes() == b"v1"
        assert _store(b).live("configs") == ()  # cleared
        back = await a.sync.sync("configs", [b.peer])
        assert back.files_transferred == 1
        assert (a.root("configs") / "x.yaml").read_bytes() == b"v1"
        await a.sync.sync("configs", [b.peer])
        assert _store(a).live("configs") == ()


async def test_another_content_wins_over_a_tombstone(tmp_path: Path) -> None:
    async with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b:
        old = time.time_ns() - 100 * SECOND
        a.write("x.yaml", b"v1", category="configs", mtime_ns=old)
        await b.sync.sync("configs", [a.peer])
        b.write("x.yaml", b"v2 here", category="configs", mtime_ns=old + 1)
        (a.root("configs") / "x.yaml").unlink()
        stats = await b.sync.sync("configs", [a.peer])
        assert (stats.deleted, stats.errors) == (0, ())
        assert (b.root("configs") / "x.yaml").read_bytes() == b"v2 here"
        back = await a.sync.sync("configs", [b.peer])  # the other version comes back to a
        assert back.files_transferred == 1


async def test_tombstones_expire_after_the_ttl(tmp_path: Path) -> None:
    clock = FakeClock()
    async with _node(tmp_path, "a", clock) as a, _node(tmp_path, "b", clock) as b:
        a.write("x.yaml", b"v1", category="configs", mtime_ns=clock.now_ns - SECOND)
        await b.sync.sync("configs", [a.peer])
        (a.root("configs") / "x.yaml").unlink()
        await a.catalog.listing("configs")
        assert len(_store(a).live("configs")) == 1
        clock.now_ns += int((TTL_S + 1) * SECOND)
        assert _store(a).live("configs") == ()
        stats = await b.sync.sync("configs", [a.peer])
        assert (stats.deleted, stats.errors) == (0, ())
        assert (b.root("configs") / "x.yaml").exists()
        await a.sync.sync("configs", [])
        assert _store(a).held("configs") == {}  # purged from the store too


async def test_a_node_away_longer_than_the_ttl_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    async with _node(tmp_path, "a", clock) as a, _node(tmp_path, "b", clock) as b:
        a.write("x.yaml", b"v1", category="configs", mtime_ns=clock.now_ns - SECOND)
        a.write("y.yaml", b"v2", category="configs", mtime_ns=clock.now_ns - SECOND)
        first = await b.sync.sync("configs", [a.peer])
        assert (first.files_transferred, first.stale_beyond_tombstone_ttl) == (2, False)
        # b goes away; a deletes x, and the tombstone expires before b is back
        (a.root("configs") / "x.yaml").unlink()
        await a.catalog.listing("configs")
        clock.now_ns += int((TTL_S + 1) * SECOND)
        with caplog.at_level(logging.WARNING, logger="sync.files.deletions"):
            back = await b.sync.sync("configs", [a.peer])
        assert back.stale_beyond_tombstone_ttl
        assert back.resurrected == 1  # x: no peer has it, maybe deleted meanwhile
        assert (b.root("configs") / "x.yaml").exists()
        warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("tombstone_ttl_s" in m and "x.yaml" in m for m in warning), warning
        after = await b.sync.sync("configs", [a.peer])
        assert (after.stale_beyond_tombstone_ttl, after.resurrected) == (False, 0)


class Crash(BaseException):
    """Stands for the process dying between two steps."""


@contextlib.contextmanager
def _crash_before_unlink() -> Iterator[None]:
    real = deletions_module.delete_copy

    def crash(*args: object) -> bool:
        raise Crash

    deletions_module.delete_copy = crash  # type: ignore[assignment]
    try:
        yield
    finally:
        deletions_module.delete_copy = real


async def test_a_crash_between_tombstone_and_deletion_is_finished_later(tmp_path: Path) -> None:
    async with _node(tmp_path, "a") as a:
        a.write("x.yaml", b"v1", category="configs", mtime_ns=time.time_ns() - SECOND)
        async with _node(tmp_path, "b") as b:
            await b.sync.sync("configs", [a.peer])
            (a.root("configs") / "x.yaml").unlink()
            with _crash_before_unlink(), pytest.raises(Crash):
                await b.sync.sync("configs", [a.peer])
            assert (b.root("configs") / "x.yaml").exists()
        # the tombstone is on disk; the copy is still there: the state after a crash
        async with TombstoneStore(tmp_path / "b" / "cache" / "tombstones.db", TTL_S) as store:
            assert [t.path for t in store.live("configs")] == ["x.yaml"]
        async with _node(tmp_path, "b") as b:
            stats = await b.sync.sync("configs", [])  # no peer needed: its own tombstone
            assert stats.deleted == 1
            assert not (b.root("configs") / "x.yaml").exists()
            assert [t.path for t in _store(b).live("configs")] == ["x.yaml"]
            again = await b.sync.sync("configs", [a.peer])
            assert (again.files_transferred, again.deleted) == (0, 0)


async def test_the_manifest_etag_covers_the_tombstones(tmp_path: Path) -> None:
    async with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b:
        a.write("x.yaml", b"v1", category="configs")
        first = await b.http.list_manifest(a.peer, "configs", a.catalog.piece_size)
        assert first.tombstones == ()
        # a tombstone a learnt from a peer, for a file it never held: its files are unchanged
        learnt = Tombstone("gone.yaml", "1" * 64, "c", time.time_ns())
        await _store(a).change("configs", [learnt])
        second = await b.http.list_manifest(a.peer, "configs", a.catalog.piece_size)
        assert second.tombstones == (learnt,)
        assert second.etag != first.etag


async def test_a_missing_category_root_is_no_deletion(tmp_path: Path) -> None:
    async with _node(tmp_path, "a") as a:
        a.write("d/x.yaml", b"v1", category="configs")
        await a.catalog.listing("configs")
        shutil.rmtree(a.root("configs"))  # an unmounted volume, say
        listing = await a.catalog.listing("configs")
        assert listing.entries == ()
        assert _store(a).live("configs") == ()


async def test_a_failed_tombstone_write_keeps_the_file_in_the_cache(tmp_path: Path) -> None:
    heard: list[list[str]] = []

    async def on_removed(entries: list[ManifestEntry]) -> None:
        heard.append([entry.path for entry in entries])
        if len(heard) == 1:
            raise FileSyncError("disk gone")

    root = tmp_path / "root"
    async with ManifestCache(root, tmp_path / "cache.db", PIECE, on_removed=on_removed) as cache:
        (root / "x.yaml").parent.mkdir(parents=True, exist_ok=True)
        (root / "x.yaml").write_bytes(b"v1")
        await cache.listing()
        (root / "x.yaml").unlink()
        with pytest.raises(FileSyncError):
            await cache.listing()
        assert cache.lookup("x.yaml") is not None
        await cache.listing()
        assert heard == [["x.yaml"], ["x.yaml"]]
        assert cache.lookup("x.yaml") is None


def test_a_copy_changed_since_it_was_listed_is_not_deleted(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"v1")
    listed = stat_key(path.stat())
    path.write_bytes(b"v2, written after the listing")
    assert not delete_copy(tmp_path, "x.yaml", listed)
    assert path.read_bytes() == b"v2, written after the listing"
    assert delete_copy(tmp_path, "x.yaml", stat_key(path.stat()))
    assert not path.exists()
    assert not delete_copy(tmp_path, "x.yaml", listed)
