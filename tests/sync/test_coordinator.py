"""SyncCoordinator: pulls between real nodes, WAL logging and recovery (also after a real
SIGKILL), push with the plan's fence, cluster sync, the space guard, shared storage and bounded
concurrency. The background loop is the daemon's (tests/node/test_daemon_loops.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import aiohttp

from sync.files.catalog import FileCatalog
from sync.files.engine import SyncCoordinator, SyncOptions
from sync.files.manifest import ManifestEntry
from sync.guards import SpaceReserve, partial_name
from sync.storage import MARKER_NAME, MountInfo
from sync.transports.http import HttpTransport
from sync.transports.partial import install_file
from sync.transports.protocol import PeerRef, TransferResult
from tests.sync.files_fixtures import (
    FAST_TIMEOUTS,
    LOCAL_MOUNTS,
    NO_RESERVE,
    PIECE,
    CountingHasher,
    FileNode,
    internal_files,
)
from tests.sync.files_proxy import FaultProxy
from wal import SYNC_STARTED, EntryState, WalConfig, WalEntry, WriteAheadLog

DEAD = PeerRef("dead", "http://127.0.0.1:9")


async def _entry(node: FileNode, rel: str, category: str = "models") -> ManifestEntry:
    listing = await node.catalog.listing(category)
    return next(e for e in listing.entries if e.path == rel)


async def test_sync_pulls_new_and_newer_files_only(tmp_path: Path) -> None:
    hasher = CountingHasher()
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", hasher=hasher) as b,
    ):
        files = {f"run/{i}.pt": os.urandom(i * PIECE + 5) for i in range(4)}
        for rel, data in files.items():
            a.write(rel, data, mtime_ns=1_000 + len(data))
        a.write("c.yaml", b"lr: 1", category="configs")
        stats = await b.sync.sync("models", [a.peer])
        assert (stats.files_transferred, stats.errors) == (4, ())
        assert stats.bytes_transferred == sum(len(d) for d in files.values())
        for rel, data in files.items():
            assert (b.root() / rel).read_bytes() == data
        assert not (b.root("configs") / "c.yaml").exists()
        hasher.calls = 0
        again = await b.sync.sync("models", [a.peer])
        assert (again.files_transferred, again.errors) == (0, ())
        assert hasher.calls == 0  # pulled files were recorded, not hashed again

        a.write("run/1.pt", b"newer", mtime_ns=10**18)
        b.write("run/2.pt", b"mine is newer", mtime_ns=10**18)
        third = await b.sync.sync("models", [a.peer])
        assert third.files_transferred == 1
        assert (b.root() / "run/1.pt").read_bytes() == b"newer"
        assert (b.root() / "run/2.pt").read_bytes() == b"mine is newer"
        assert internal_files(b.root()) == []


async def test_each_transfer_is_logged_and_committed(tmp_path: Path) -> None:
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", with_wal=True) as b,
    ):
        a.write("x.bin", os.urandom(3 * PIECE))
        await b.sync.sync("models", [a.peer])
        assert await b.wal.pending(SYNC_STARTED) == []
        stats = await b.wal.stats()
        assert stats.committed == 1


async def _crash_leftovers(a: FileNode, b: FileNode, pieces: int) -> tuple[ManifestEntry, int]:
    """A pending sync_started entry and a partial file, as a killed puller leaves them."""
    entry = await _entry(a, "m.bin")
    data = (a.root() / "m.bin").read_bytes()
    (b.root() / partial_name(entry.hash)).write_bytes(data[: pieces * PIECE])
    payload = {
        "peer": a.peer.to_json(),
        "category": "models",
        "path": "m.bin",
        "hash": entry.hash,
        "size": entry.size,
        "mtime_ns": entry.mtime_ns,
    }
    return entry, await b.wal.append(SYNC_STARTED, payload)


async def test_recovery_resumes_an_interrupted_transfer(tmp_path: Path) -> None:
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", with_wal=True) as b,
    ):
        a.write("m.bin", os.urandom(6 * PIECE))
        _, wal_id = await _crash_leftovers(a, b, 3)
        result = await b.wal.recover(b.sync.recovery_handlers())
        assert result.recovered == 1
        assert (b.root() / "m.bin").read_bytes() == (a.root() / "m.bin").read_bytes()
        got = await b.wal.get(wal_id)
        assert got is not None
        assert got.state is EntryState.COMMITTED
        assert internal_files(b.root()) == []


PULLER = Path(__file__).with_name("files_puller.py")


def _pieces_in_place(partial: Path, data: bytes) -> int:
    """How many pieces of `data` the partial file already holds intact."""
    try:
        held = partial.read_bytes()
    except FileNotFoundError:
        return 0
    spans = range(0, len(data), PIECE)
    return sum(held[i : i + PIECE] == data[i : i + PIECE] for i in spans)


async def _kill_mid_transfer(url: str, data_dir: Path, data: bytes, digest: str) -> int:
    """Run a real puller process against `url` (a proxy that stalls partway), SIGKILL it once
    its partial file holds at least three intact pieces; returns how many it held."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PULLER),
        str(data_dir),
        url,
        "--piece-size",
        str(PIECE),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    partial = data_dir / "models" / partial_name(digest)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            assert (await process.stdout.readline()).strip() == b"READY"
            while await asyncio.to_thread(_pieces_in_place, partial, data) < 3:
                assert process.returncode is None, "the puller ended before the kill"
                await asyncio.sleep(0.01)
        process.kill()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    held = _pieces_in_place(partial, data)
    assert 3 <= held < len(data) // PIECE, f"the kill did not land mid-transfer ({held} pieces)"
    return held


async def test_resume_after_a_real_sigkill_reuses_verified_pieces(tmp_path: Path) -> None:
    data = os.urandom(8 << 20)  # two streams of 4 MiB, written in batches of 1 MiB
    puller = tmp_path / "puller"
    async with FileNode(tmp_path / "a", "a") as a:
        a.write("m.bin", data)
        entry = await _entry(a, "m.bin")
        async with FaultProxy(a.port, stall_after=6 << 20) as proxy:
            held = await _kill_mid_transfer(proxy.url, puller, data, entry.hash)
            proxy.release()  # it serves the resume: the WAL entry names it as the peer
            catalog = FileCatalog(
                {"models": puller / "models"},
                puller / "cache",
                piece_size=PIECE,
                mounts=LOCAL_MOUNTS,
            )
            wal = WriteAheadLog(puller / "wal.db", config=WalConfig(quick_check_on_open=False))
            http = HttpTransport(node_id="puller", timeouts=FAST_TIMEOUTS)
            async with wal, catalog, http:
                pending = await wal.pending(SYNC_STARTED)
                assert [e.payload["path"] for e in pending] == ["m.bin"]  # left by the kill
                coordinator = SyncCoordinator(
                    catalog,
                    http,
                    self_peer=PeerRef("puller", "http://127.0.0.1:9"),
                    wal=wal,
                    options=SyncOptions(timeouts=FAST_TIMEOUTS, reserve=NO_RESERVE),
                )
                results: list[object] = []
                resume = coordinator.recovery_handlers()[SYNC_STARTED]

                async def recording(wal_entry: WalEntry) -> object:
                    results.append(await resume(wal_entry))
                    return results[-1]

                async with coordinator:
                    outcome = await wal.recover({SYNC_STARTED: recording})
                assert outcome.recovered == 1
                (result,) = results
                assert isinstance(result, TransferResult)
                assert result.resumed_bytes >= held * PIECE  # pieces verified before the kill
                assert result.resumed_bytes + result.bytes_transferred == len(data)
                assert (puller / "models" / "m.bin").read_bytes() == data
                assert internal_files(puller / "models") == []
                assert await wal.pending(SYNC_STARTED) == []


async def test_recovery_drops_a_superseded_partial(tmp_path: Path) -> None:
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", with_wal=True) as b,
    ):
        a.write("m.bin", os.urandom(6 * PIECE))
        old, wal_id = await _crash_leftovers(a, b, 2)
        a.write("m.bin", os.urandom(6 * PIECE))
        await b.wal.recover(b.sync.recovery_handlers())
        got = await b.wal.get(wal_id)
        assert got is not None
        assert got.state is EntryState.ROLLED_BACK
        assert "superseded" in (got.error or "")
        assert not (b.root() / partial_name(old.hash)).exists()
        assert not (b.root() / "m.bin").exists()


async def test_recovery_keeps_the_partial_when_the_peer_is_away(tmp_path: Path) -> None:
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", with_wal=True) as b,
    ):
        a.write("m.bin", os.urandom(4 * PIECE))
        entry, first_id = await _crash_leftovers(a, b, 2)
        await b.wal.rollback(first_id)
        wal_id = await b.wal.append(
            SYNC_STARTED,
            {"peer": DEAD.to_json(), "category": "models", "path": "m.bin", "hash": entry.hash},
        )
        await b.wal.recover(b.sync.recovery_handlers())
        got = await b.wal.get(wal_id)
        assert got is not None
        assert got.state is EntryState.ROLLED_BACK
        assert (b.root() / partial_name(entry.hash)).exists()


async def test_start_sweeps_temp_files_but_keeps_partials_to_resume(tmp_path: Path) -> None:
    options = SyncOptions(timeouts=FAST_TIMEOUTS, reserve=NO_RESERVE, partial_max_age_s=0.0)
    async with FileNode(tmp_path / "a", "a") as a:
        a.write("m.bin", os.urandom(4 * PIECE))
        async with FileNode(tmp_path / "b", "b", with_wal=True, options=options) as b:
            entry, _ = await _crash_leftovers(a, b, 1)
            (b.root() / ".shoal-tmp-x-123").write_bytes(b"t")
            (b.root() / partial_name("f" * 64)).write_bytes(b"orphan")
            await b.sync.start()
            assert internal_files(b.root()) == [partial_name(entry.hash)]


async def test_push_asks_the_peer_to_pull(tmp_path: Path) -> None:
    source = tmp_path / "outside.pt"
    source.write_bytes(os.urandom(5 * PIECE + 1))
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        result = await a.sync.push_file(source, "models", "pushed/ckpt.pt", b.peer)
        assert result is not None
        assert (result.peer, result.size_bytes) == ("a", source.stat().st_size)
        assert (a.root() / "pushed" / "ckpt.pt").read_bytes() == source.read_bytes()
        assert (b.root() / "pushed" / "ckpt.pt").read_bytes() == source.read_bytes()
        assert await a.sync.push_file(source, "models", "pushed/ckpt.pt", b.peer) is None
        in_place = a.root() / "pushed" / "ckpt.pt"
        assert await a.sync.push_file(in_place, "models", "pushed/ckpt.pt", b.peer) is None


async def test_pull_endpoint_refusals(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "b", "b") as b, aiohttp.ClientSession() as session:
        url = f"{b.peer.url}/v1/sync/models/pull"
        good = {"peer": {"node_id": "a", "url": "http://127.0.0.1:9"}, "hash": "0" * 64}
        for body, status in [
            ({**good, "path": "../x"}, 400),
            ({**good, "path": "x", "hash": "zz"}, 400),
            ({**good, "path": "x", "peer": {"node_id": "a", "url": "file:///etc"}}, 400),
            ([], 400),
            ({**good, "path": "x"}, 502),  # the source is unreachable
        ]:
            async with session.post(url, json=body) as response:
                assert response.status == status, body
        async with session.post(f"{b.peer.url}/v1/sync/games/pull", json=good) as response:
            assert response.status == 404


async def test_full_cluster_sync_reports_failed_nodes(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("m.bin", b"model")
        a.write("c.yaml", b"config", category="configs")
        b.sync._peers_fn = lambda: [a.peer, DEAD, b.peer]
        stats = await b.sync.full_cluster_sync(["models", "configs"], timeout_s=10.0)
        assert (stats.total_files, stats.total_bytes) == (2, len(b"model") + len(b"config"))
        assert (stats.nodes_synced, stats.failed_nodes) == (1, ("dead",))
        assert set(stats.category_stats) == {"models", "configs"}
        assert stats.category_stats["models"].errors[0].startswith("dead: manifest")


async def test_space_reserve_refuses_before_the_transfer(tmp_path: Path) -> None:
    options = SyncOptions(timeouts=FAST_TIMEOUTS, reserve=SpaceReserve(1 << 62, 0.0))
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", with_wal=True, options=options) as b,
    ):
        a.write("m.bin", os.urandom(PIECE))
        stats = await b.sync.sync("models", [a.peer])
        assert stats.files_transferred == 0
        assert "must stay free" in stats.errors[0]
        assert internal_files(b.root()) == []
        assert (await b.wal.stats()).appended_total == 0


def _nfs(base: Path) -> tuple[MountInfo, ...]:
    return (MountInfo("/dev/root", "/", "ext4"), MountInfo("filer:/export", str(base), "nfs4"))


async def test_shared_storage_is_not_copied(tmp_path: Path) -> None:
    async with (
        FileNode(tmp_path / "a", "a", mounts=_nfs(tmp_path)) as a,
        FileNode(tmp_path / "b", "b", mounts=_nfs(tmp_path)) as b,
    ):
        a.write("m.bin", b"on the filer")
        assert a.catalog.shared_id("models") != b.catalog.shared_id("models")
        marker = (a.root() / MARKER_NAME).read_text()
        (b.root() / MARKER_NAME).write_text(marker)  # b now sees the same export and marker
        async with FileNode(tmp_path / "b", "b2", mounts=_nfs(tmp_path)) as same:
            assert same.catalog.shared_id("models") == a.catalog.shared_id("models")
            stats = await same.sync.sync("models", [a.peer])
            assert stats.files_transferred == 0
            assert not (same.root() / "m.bin").exists()
        stats = await b.sync.sync("configs", [a.peer])
        assert stats.errors == ()


class SlowCopyTransport:
    """A transport at the seam: copies from the peer's directory, counting concurrency."""

    name = "copy"

    def __init__(self, roots: dict[str, Path]) -> None:
        self._roots = roots
        self.active: dict[str, int] = {"large": 0, "small": 0}
        self.peak: dict[str, int] = {"large": 0, "small": 0}

    async def fetch(
        self, peer: PeerRef, category: str, entry: ManifestEntry, dest_root: Path
    ) -> TransferResult:
        kind = "large" if entry.size >= 4 * PIECE else "small"
        self.active[kind] += 1
        self.peak[kind] = max(self.peak[kind], self.active[kind])
        try:
            await asyncio.sleep(0.03)
            final = dest_root / entry.path
            temp = dest_root / f".shoal-tmp-{entry.path}-1"
            await asyncio.to_thread(shutil.copyfile, self._roots[peer.node_id] / entry.path, temp)
            await asyncio.to_thread(install_file, temp, final, entry)
        finally:
            self.active[kind] -= 1
        return TransferResult(peer.node_id, self.name, category, entry.path, entry.hash,
                              entry.size, entry.size, 0, 0.03)  # fmt: skip

    async def close(self) -> None:
        return None


async def test_transfers_are_bounded_per_size_class(tmp_path: Path) -> None:
    copier = SlowCopyTransport({})
    options = SyncOptions(
        timeouts=FAST_TIMEOUTS,
        reserve=NO_RESERVE,
        max_large_transfers=1,
        max_small_transfers=2,
        large_file_bytes=4 * PIECE,
    )
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(
            tmp_path / "b", "b", options=options, transports=lambda http: {"copy": copier}
        ) as b,
    ):
        copier._roots["a"] = a.root()
        for i in range(3):
            a.write(f"big{i}", os.urandom(5 * PIECE))
        for i in range(6):
            a.write(f"small{i}", os.urandom(100))
        stats = await b.sync.sync("models", [PeerRef("a", a.peer.url, ("copy",))])
        assert (stats.files_transferred, stats.errors) == (9, ())
        assert copier.peak == {"large": 1, "small": 2}


async def test_catalog_and_options_from_node_settings(tmp_path: Path) -> None:
    from config import load_settings
    from sync.files.catalog import CHECKPOINTS, FILE_CATEGORIES, FileCatalog

    settings = load_settings(env={"SHOAL_DATA_DIR": str(tmp_path), "SHOAL_SYNC_TIMEOUT": "42"})
    catalog = FileCatalog.for_settings(settings.settings, piece_size=PIECE, mounts=LOCAL_MOUNTS)
    async with catalog:
        assert FILE_CATEGORIES == ("models", "training", "configs")
        assert catalog.categories == (*FILE_CATEGORIES, CHECKPOINTS)  # served, never synced
        assert catalog.root(CHECKPOINTS) == settings.settings.checkpoint_dir
        assert catalog.root("models") == settings.settings.category_path("models")
        assert (tmp_path / "sync" / "manifest-models.db").exists()
    options = SyncOptions.from_settings(settings.settings, max_large_transfers=2)
    assert (options.timeouts.sync_s, options.max_large_transfers) == (42.0, 2)
