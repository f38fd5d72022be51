"""The manifest cache: an unchanged tree is re-listed without hashing, changes are hashed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sync.files import dirstamps
from sync.files.manifest import ManifestEntry
from sync.files.manifest_cache import ManifestCache
from tests.sync.files_fixtures import PIECE, CountingHasher, hash_file, write_file


def _tree(root: Path, count: int) -> None:
    for i in range(count):
        write_file(root / f"d{i % 7}" / f"f{i:03d}.bin", os.urandom(i * 97 % 5000))


async def test_unchanged_tree_is_relisted_without_hashing(tmp_path: Path) -> None:
    root, db = tmp_path / "models", tmp_path / "cache" / "m.db"
    _tree(root, 120)
    write_file(root / "big.bin", os.urandom(3 * PIECE + 11))
    hasher = CountingHasher()
    async with ManifestCache(root, db, PIECE, hasher=hasher) as cache:
        first = await cache.listing()
        assert hasher.calls == 121
        assert len(first.entries) == 121
        assert list(first.paths) == sorted(first.paths)
        big = cache.lookup("big.bin")
        assert big is not None
        assert (big.size, big.hash, big.pieces) == hash_file(root / "big.bin", PIECE)
        second = await cache.listing()
        assert hasher.calls == 121
        assert second.entries == first.entries
        assert second.etag == first.etag

    again = CountingHasher()
    async with ManifestCache(root, db, PIECE, hasher=again) as cache:
        assert (await cache.listing()).entries == first.entries
        assert again.calls == 0  # the cache file survived the restart


async def test_changed_added_and_removed_files(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _tree(root, 20)
    hasher = CountingHasher()
    async with ManifestCache(root, tmp_path / "m.db", PIECE, hasher=hasher) as cache:
        before = await cache.listing()
        hasher.calls = 0
        write_file(root / "d0" / "f000.bin", b"new content")
        write_file(root / "d9" / "added.bin", b"added")
        (root / "d1" / "f001.bin").unlink()
        stamp = root / "d2" / "f002.bin"
        os.utime(stamp, ns=(1, 1))  # same bytes, new mtime: hashed again
        after = await cache.listing()
        assert hasher.calls == 3
        paths = set(after.paths)
        assert "d1/f001.bin" not in paths
        assert "d9/added.bin" in paths
        assert after.etag != before.etag
        changed = cache.lookup("d0/f000.bin")
        assert changed is not None
        assert changed.hash == hash_file(root / "d0" / "f000.bin", PIECE)[1]
        assert changed.size == len(b"new content")


async def test_listing_skips_internal_files_symlinks_and_special_files(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_file(root / "ok.bin", b"ok")
    write_file(root / ".shoal-partial-abc", b"partial")
    write_file(root / "sub" / ".shoal-tmp-x-1", b"temp")
    write_file(tmp_path / "outside.bin", b"secret")
    (root / "link-out").symlink_to(tmp_path / "outside.bin")
    (root / "link-in").symlink_to(root / "ok.bin")
    os.mkfifo(root / "fifo")
    async with ManifestCache(root, tmp_path / "m.db", PIECE) as cache:
        listing = await cache.listing()
    assert listing.paths == ("ok.bin",)


async def test_pages_follow_the_cursor(tmp_path: Path) -> None:
    root = tmp_path / "models"
    names = ["a.b", "a/b", "a0", "b", "c/d/e"]
    for name in names:
        write_file(root.joinpath(*name.split("/")), b"x")
    async with ManifestCache(root, tmp_path / "m.db", PIECE) as cache:
        listing = await cache.listing()
    seen: list[str] = []
    after = None
    while True:
        start, end, after = listing.page(after, 2)
        seen.extend(listing.paths[start:end])
        if after is None:
            break
    assert seen == sorted(names) == list(listing.paths)


async def test_corrupt_cache_file_is_rebuilt(tmp_path: Path) -> None:
    root, db = tmp_path / "models", tmp_path / "m.db"
    write_file(root / "x.bin", b"x")
    db.write_bytes(b"this is not sqlite" * 100)
    hasher = CountingHasher()
    async with ManifestCache(root, db, PIECE, hasher=hasher) as cache:
        assert (await cache.listing()).paths == ("x.bin",)
    assert hasher.calls == 1


async def test_recorded_entries_are_not_hashed_again(tmp_path: Path) -> None:
    root = tmp_path / "models"
    path = write_file(root / "got.bin", os.urandom(2 * PIECE + 3))
    size, digest, pieces = hash_file(path, PIECE)
    hasher = CountingHasher()
    async with ManifestCache(root, tmp_path / "m.db", PIECE, hasher=hasher) as cache:
        entry = ManifestEntry("got.bin", size, 0, digest, pieces, PIECE)
        await cache.record(entry, path.stat())
        listing = await cache.listing()
        assert hasher.calls == 0
        assert listing.entries[0].hash == digest
        assert listing.entries[0].mtime_ns == path.stat().st_mtime_ns


async def test_files_recorded_after_a_listing_appear_in_the_next(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_file(root / "old.bin", b"old")
    hasher = CountingHasher()
    async with ManifestCache(root, tmp_path / "m.db", PIECE, hasher=hasher) as cache:
        first = await cache.listing()
        path = write_file(root / "new.bin", b"installed by a transfer")
        size, digest, pieces = hash_file(path, PIECE)
        await cache.record(ManifestEntry("new.bin", size, 0, digest, pieces, PIECE), path.stat())
        second = await cache.listing()
        assert second.paths == ("new.bin", "old.bin")
        assert second.etag != first.etag
        assert hasher.calls == 1
        assert (await cache.listing()).etag == second.etag


async def test_a_recent_listing_is_reused_only_while_no_directory_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dirstamps, "RACY_NS", 0)  # the tree was just written: not racy here
    root = tmp_path / "configs"
    _tree(root, 20)
    async with ManifestCache(root, tmp_path / "m.db", PIECE) as cache:
        first = await cache.listing()
        assert await cache.listing(max_age_s=60) is first  # nothing changed: one stat per dir
        (root / "d3" / "f003.bin").unlink()
        after_delete = await cache.listing(max_age_s=60)
        assert "d3/f003.bin" not in after_delete.paths
        write_file(root / "d9" / "new.bin", b"new")  # a new directory, a new file
        after_create = await cache.listing(max_age_s=60)
        assert "d9/new.bin" in after_create.paths
        (root / "d4" / "f004.bin").rename(root / "d5" / "moved.bin")
        after_rename = await cache.listing(max_age_s=60)
        assert "d4/f004.bin" not in after_rename.paths
        assert "d5/moved.bin" in after_rename.paths
        assert await cache.listing(max_age_s=60) is after_rename


async def test_a_directory_changed_during_the_scan_tick_forces_the_next_scan(
    tmp_path: Path,
) -> None:
    root = tmp_path / "configs"
    _tree(root, 5)  # written just now: within RACY_NS of the scan
    async with ManifestCache(root, tmp_path / "m.db", PIECE) as cache:
        first = await cache.listing()
        again = await cache.listing(max_age_s=60)
        assert again is not first
        assert again.entries == first.entries
