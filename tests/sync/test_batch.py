"""Small files pulled in batches: one request and one WAL entry per batch, each file verified,
fsynced and renamed into place, one directory fsync per directory, no hashing on either side
beyond the manifest; failures in a batch fall back to one file at a time; a SIGKILL mid-batch
leaves every file absent or complete."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import sync.files.batch as batch_module
from health import BreakerConfig, BreakerRegistry, CircuitState
from sync.errors import ContentMismatchError
from sync.files.batch import BatchWriter, hash_bytes
from sync.files.manifest import ManifestEntry
from sync.files.plan import SyncOptions
from sync.transports.protocol import PeerRef
from tests.sync.files_fixtures import (
    FAST_TIMEOUTS,
    NO_RESERVE,
    PIECE,
    CountingHasher,
    FileNode,
    content_hash_of,
    internal_files,
)
from tests.sync.files_proxy import FaultProxy
from tests.sync.test_transport_contract import zygote
from wal import SYNC_STARTED, EntryState


def _tree(node: FileNode, count: int, seed: int = 7) -> dict[str, bytes]:
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for index in range(count):
        rel = f"shard-{index % 4}/part-{index:04d}.json"
        data = rng.randbytes(rng.randint(256, 2048))
        node.write(rel, data)
        files[rel] = data
    return files


def _count_requests(node: FileNode) -> dict[str, int]:
    """Count the requests `node`'s server answers, by path (wraps its app's handler)."""
    counts: dict[str, int] = {}
    assert node.server is not None
    app = node.server.app
    assert app is not None
    router = app.router
    original = router.resolve

    async def resolve(request: Any) -> Any:
        counts[request.path] = counts.get(request.path, 0) + 1
        return await original(request)

    router.resolve = resolve  # type: ignore[method-assign]
    return counts


async def test_many_small_files_come_in_one_request_under_one_wal_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_hasher, puller_hasher = CountingHasher(), CountingHasher()
    async with (
        FileNode(tmp_path / "a", "a", hasher=server_hasher) as a,
        FileNode(tmp_path / "b", "b", with_wal=True, hasher=puller_hasher) as b,
    ):
        files = _tree(a, 120)
        await a.catalog.listing("models")  # the server's manifest: every file hashed once
        hashed_by_server = server_hasher.calls
        assert hashed_by_server == 120
        requests = _count_requests(a)
        appended: list[int] = []
        append = b.wal.append

        async def spy(entry_type: str, payload: dict[str, Any], **kw: Any) -> int:
            entry_id = await append(entry_type, payload, **kw)
            appended.append(entry_id)
            return entry_id

        monkeypatch.setattr(b.wal, "append", spy)
        synced: list[Path] = []
        monkeypatch.setattr(batch_module, "fsync_directory", synced.append)

        stats = await b.sync.sync("models", [a.peer])

        assert stats.errors == ()
        assert stats.files_transferred == 120
        for rel, data in files.items():
            assert (b.root() / rel).read_bytes() == data
            assert (b.root() / rel).stat().st_mtime_ns == (a.root() / rel).stat().st_mtime_ns
        assert requests.get("/v1/sync/models/files") == 1
        assert "/v1/sync/models/file" not in requests
        assert len(appended) == 1
        logged = await b.wal.get(appended[0])
        assert logged is not None
        assert logged.state is EntryState.COMMITTED
        assert len(logged.payload["batch"]) == 120
        assert sorted(synced) == sorted({(b.root() / rel).parent for rel in files})
        assert server_hasher.calls == hashed_by_server  # served from the manifest cache
        await b.catalog.listing("models")
        assert puller_hasher.calls == 0  # installed files were recorded, not hashed again
        assert internal_files(b.root()) == []
        assert b.sync.progress.files_done == 120
        assert b.sync.progress.bytes_done == sum(len(data) for data in files.values())


async def test_files_the_batch_cannot_serve_are_pulled_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        files = _tree(a, 10)
        cache = a.catalog.cache("models")
        lookup = cache.lookup_keyed
        stale = "shard-1/part-0001.json"

        def not_cached(path: str) -> Any:
            return None if path == stale else lookup(path)

        monkeypatch.setattr(cache, "lookup_keyed", not_cached)  # as if not hashed yet
        requests = _count_requests(a)

        stats = await b.sync.sync("models", [a.peer])

        assert stats.errors == ()
        assert stats.files_transferred == 10
        for rel, data in files.items():
            assert (b.root() / rel).read_bytes() == data
        assert requests.get("/v1/sync/models/files") == 1
        assert requests.get("/v1/sync/models/file") == 1  # only the refused one went alone


async def test_batch_route_answers_each_file_and_refuses_a_bad_body(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "a", "a") as a:
        a.write("x/one.bin", b"one")
        await a.catalog.listing("models")
        url = f"{a.peer.url}/v1/sync/models/files"
        wrong = "0" * 64
        right = content_hash_of(a.root() / "x/one.bin")
        body = {
            "files": [
                {"path": "x/one.bin", "hash": right},
                {"path": "x/one.bin", "hash": wrong},
                {"path": "x/missing.bin", "hash": wrong},
            ]
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body) as response:
                assert response.status == 200
                raw = await response.read()
            async with session.post(url, json={"files": [{"path": "../x", "hash": wrong}]}) as bad:
                assert bad.status == 400
                assert set(await bad.json()) == {"error", "reason", "status"}
        frames = []
        while raw:
            (length,) = batch_module.HEADER.unpack(raw[:4])
            header = batch_module.parse_header(raw[4 : 4 + length])
            size = header.get("size", 0)
            frames.append((header, raw[4 + length : 4 + length + size]))
            raw = raw[4 + length + size :]
        assert frames[0] == ({"path": "x/one.bin", "size": 3, "hash": right}, b"one")
        assert (frames[1][0]["status"], frames[1][0]["hash"]) == (412, right)
        assert frames[2][0]["status"] == 404
        a.write("x/one.bin", b"new bytes, not yet hashed")  # the cache still has "one"
        async with aiohttp.ClientSession() as session:
            one = {"files": [{"path": "x/one.bin", "hash": right}]}
            async with session.post(url, json=one) as response:
                raw = await response.read()
        (length,) = batch_module.HEADER.unpack(raw[:4])
        header = batch_module.parse_header(raw[4 : 4 + length])
        assert (header["error"], header["status"]) == ("stale", 409)
        assert len(raw) == 4 + length  # no bytes of a version nobody hashed


def test_a_corrupt_file_in_a_batch_is_kept_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    good, bad = b"good bytes", b"bad bytes!"
    entries = [
        ManifestEntry("d/good", len(good), 10**18, hash_bytes(good, PIECE), (), PIECE),
        ManifestEntry("d/bad", len(bad), 10**18, hash_bytes(b"other one!", PIECE), (), PIECE),
    ]
    writer = BatchWriter.at(root)
    results = writer.install([(entries[0], good), (entries[1], bad)])
    writer.finish()
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], ContentMismatchError)
    assert (root / "d/good").read_bytes() == good
    assert sorted(os.listdir(root / "d")) == ["good"]  # no temp file, no bad file


def test_hash_bytes_matches_the_manifest_hash(tmp_path: Path) -> None:
    for size in (0, 5, PIECE, 3 * PIECE + 5):
        data = os.urandom(size)
        path = tmp_path / f"f{size}"
        path.write_bytes(data)
        assert hash_bytes(data, PIECE) == content_hash_of(path)


async def test_sigkill_mid_batch_leaves_each_file_absent_or_complete(tmp_path: Path) -> None:
    rng = random.Random(99)
    puller_dir = tmp_path / "puller"
    options = SyncOptions(timeouts=FAST_TIMEOUTS, reserve=NO_RESERVE)
    async with FileNode(tmp_path / "server", "server", options=options) as server:
        files = _tree(server, 240, seed=3)
        await server.catalog.listing("models")
        total = sum(len(data) for data in files.values())
        bandwidth = total // 2  # about 2 s per full batch after the limiter's burst
        args = [
            str(puller_dir),
            server.peer.url,
            "--piece-size",
            str(PIECE),
            "--bandwidth",
            str(bandwidth),
        ]
        partial_rounds = 0
        async with zygote() as pullers:
            for round_no in range(6):
                await pullers.round(args, rng.uniform(0.2, 1.4))
                present = [rel for rel in files if (puller_dir / "models" / rel).exists()]
                for rel in present:
                    got = (puller_dir / "models" / rel).read_bytes()
                    assert got == files[rel], f"round {round_no}: {rel} is not complete"
                partial_rounds += 0 < len(present) < len(files)
                if len(present) == len(files):
                    break
            done, lines = await pullers.round(args, None)
        assert done, lines
        for rel, data in files.items():
            assert (puller_dir / "models" / rel).read_bytes() == data
        assert internal_files(puller_dir / "models") == []
        assert partial_rounds >= 1, "no kill landed mid-batch"
        assert any(line.startswith("DONE") for line in lines)


async def test_interrupted_batch_entry_is_settled_by_recovery(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "b", "b", with_wal=True) as b:
        b.write("d/here", b"here")
        here = content_hash_of(b.root() / "d/here")
        payload: dict[str, Any] = {
            "peer": {"node_id": "a", "url": "http://127.0.0.1:9"},
            "category": "models",
            "batch": [
                {"path": "d/here", "hash": here, "size": 4, "mtime_ns": 1},
                {"path": "d/gone", "hash": "1" * 64, "size": 4, "mtime_ns": 1},
            ],
        }
        first = await b.wal.append(SYNC_STARTED, payload)
        complete = await b.wal.append(SYNC_STARTED, {**payload, "batch": payload["batch"][:1]})
        await b.wal.recover(b.sync.recovery_handlers())
        rolled = await b.wal.get(first)
        assert rolled is not None
        assert rolled.state is EntryState.ROLLED_BACK
        assert "1 of 2 files not installed" in (rolled.error or "")
        done = await b.wal.get(complete)
        assert done is not None
        assert done.state is EntryState.COMMITTED
        assert await b.wal.pending(SYNC_STARTED) == []


async def test_upload_cap_shapes_what_a_node_serves(tmp_path: Path) -> None:
    rate = 1 << 20
    async with (
        FileNode(tmp_path / "a", "a", upload_limit_bytes_s=rate) as a,
        FileNode(tmp_path / "b", "b") as b,
    ):
        big = os.urandom(2 << 20)  # above batch_file_bytes: served by the file route
        a.write("big.bin", big)
        small = _tree(a, 40)
        small_bytes = sum(len(data) for data in small.values())
        started = time.monotonic()
        stats = await b.sync.sync("models", [a.peer])
        elapsed = time.monotonic() - started
        assert stats.errors == ()
        assert (b.root() / "big.bin").read_bytes() == big
        # every served byte passed the cap: at most one burst (64 KiB) was free
        floor_s = (len(big) + small_bytes - (64 << 10)) / rate
        assert elapsed >= 0.9 * floor_s, f"{elapsed:.2f} s, the cap allows {floor_s:.2f} s"


async def test_progress_advances_by_bytes_within_a_file(tmp_path: Path) -> None:
    size = 16 << 20
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", transport_options={"bandwidth_bytes_per_s": 8 << 20}) as b,
    ):
        a.write("ckpt.pt", os.urandom(size))
        task = asyncio.ensure_future(b.sync.sync("models", [a.peer]))
        seen: set[int] = set()
        while not task.done():
            progress = b.sync.progress
            if progress.files_done == 0:
                seen.add(progress.bytes_done)
            await asyncio.sleep(0.01)
        stats = await task
        assert stats.files_transferred == 1
        assert b.sync.progress.bytes_done == size
        inside = sorted(value for value in seen if 0 < value < size)
        assert inside, f"the bar only moved when the file was done: {sorted(seen)}"


async def test_a_byte_corrupted_in_a_batch_is_caught_and_the_file_pulled_again(
    tmp_path: Path,
) -> None:
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        files = _tree(a, 30)
        requests = _count_requests(a)
        # the manifest (about 6 KB) passes intact; the flipped byte lands in the batch stream
        async with FaultProxy(a.port, corrupt_after=20_000) as proxy:
            stats = await b.sync.sync("models", [PeerRef("a", proxy.url)])
            assert proxy.corrupted
        assert stats.errors == ()
        for rel, data in files.items():
            assert (b.root() / rel).read_bytes() == data
        assert requests.get("/v1/sync/models/file", 0) >= 1  # pulled again on its own
        assert internal_files(b.root()) == []


async def test_a_peer_dying_mid_batch_trips_its_breaker_and_the_fallback_serves(
    tmp_path: Path,
) -> None:
    breakers = BreakerRegistry(BreakerConfig(failure_threshold=1))
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "c", "c") as c,
        FileNode(tmp_path / "b", "b", with_wal=True, breakers=breakers) as b,
    ):
        files = _tree(a, 60)
        for rel, data in files.items():
            c.write(rel, data, mtime_ns=(a.root() / rel).stat().st_mtime_ns)
        async with FaultProxy(a.port, die_after=30_000) as proxy:
            stats = await b.sync.sync("models", [PeerRef("a", proxy.url), c.peer])
            assert proxy.dead
        assert stats.errors == ()
        for rel, data in files.items():
            assert (b.root() / rel).read_bytes() == data
        assert stats.nodes["c"].files_transferred > 0
        assert breakers.breaker_for("a", "http").state is CircuitState.OPEN
        assert await b.wal.pending(SYNC_STARTED) == []
        assert internal_files(b.root()) == []


async def test_the_server_reads_a_batch_in_bounded_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sync.files.routes as routes_module

    monkeypatch.setattr(routes_module, "BATCH_READ_BYTES", 200_000)
    read = routes_module._read_group
    groups: list[int] = []

    def spy(root: Path, group: list[Any]) -> bytes:
        groups.append(sum(cached[0].size for _, _, cached in group if cached is not None))
        return read(root, group)

    monkeypatch.setattr(routes_module, "_read_group", spy)
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        files = {f"d/f{index}": os.urandom(90_000) for index in range(8)}
        for rel, data in files.items():
            a.write(rel, data)
        stats = await b.sync.sync("models", [a.peer])
        assert stats.files_transferred == 8
        assert stats.errors == ()
        assert sum(groups) == 8 * 90_000
        assert max(groups) <= 200_000 + 90_000  # one file past the bound at most
