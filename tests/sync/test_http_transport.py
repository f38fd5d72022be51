"""The HTTP transport and the file routes: ranges, hash preconditions, resume from verified
pieces, parallel ranges, bandwidth limit, paged manifests with etags."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import pytest

from sync import FileChangedError, HttpTransport, ManifestEntry, PartialFile, TransferBusyError
from sync.files import download as download_module
from sync.files.download import WRITE_BYTES, PieceRun, PieceSink
from sync.guards import partial_name
from sync.transports.partial import start_writeback
from sync.transports.protocol import PeerRef
from tests.sync.files_fixtures import FAST_TIMEOUTS, PIECE, FileNode, internal_files
from tests.sync.files_proxy import FaultProxy


async def _entry(node: FileNode, rel: str, category: str = "models") -> ManifestEntry:
    listing = await node.catalog.listing(category)
    return next(e for e in listing.entries if e.path == rel)


async def test_fetch_installs_a_verified_file_with_its_mtime(tmp_path: Path) -> None:
    data = os.urandom(5 * PIECE + 123)
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("run/ckpt.pt", data, mtime_ns=1_700_000_000_123_456_789)
        entry = await _entry(a, "run/ckpt.pt")
        result = await b.http.fetch(a.peer, "models", entry, b.root())
        final = b.root() / "run" / "ckpt.pt"
        assert final.read_bytes() == data
        assert final.stat().st_mtime_ns == 1_700_000_000_123_456_789
        assert (result.bytes_transferred, result.resumed_bytes) == (len(data), 0)
        assert internal_files(b.root()) == []


async def test_parallel_range_requests(tmp_path: Path) -> None:
    data = os.urandom(9 * PIECE + 1)
    options = {"streams": 3, "parallel_min_bytes": 0}
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", transport_options=options) as b,
    ):
        a.write("big.bin", data)
        entry = await _entry(a, "big.bin")
        async with FaultProxy(a.port) as proxy:
            peer = PeerRef("a", proxy.url)
            result = await b.http.fetch(peer, "models", entry, b.root())
        assert (b.root() / "big.bin").read_bytes() == data
        assert result.bytes_transferred == len(data)
        # three range requests at once: one connection each (sequential ones would share one)
        assert (proxy.connections, proxy.peak_connections) == (3, 3)


async def test_empty_file(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("empty", b"")
        entry = await _entry(a, "empty")
        await b.http.fetch(a.peer, "models", entry, b.root())
        assert (b.root() / "empty").read_bytes() == b""


async def test_resume_uses_only_verified_pieces(tmp_path: Path) -> None:
    data = os.urandom(8 * PIECE)
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("m.bin", data)
        entry = await _entry(a, "m.bin")
        partial = b.root() / partial_name(entry.hash)
        damaged = bytearray(data[: 5 * PIECE])
        damaged[3 * PIECE + 10] ^= 0xFF  # piece 3 is corrupt: fetched again
        partial.write_bytes(bytes(damaged))
        result = await b.http.fetch(a.peer, "models", entry, b.root())
        assert (b.root() / "m.bin").read_bytes() == data
        assert result.resumed_bytes == 4 * PIECE
        assert result.bytes_transferred == 4 * PIECE
        assert not partial.exists()


async def test_partial_of_another_version_is_never_used(tmp_path: Path) -> None:
    old, new = os.urandom(4 * PIECE), os.urandom(4 * PIECE)
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("m.bin", old)
        old_entry = await _entry(a, "m.bin")
        (b.root() / partial_name(old_entry.hash)).write_bytes(old[: 2 * PIECE])
        a.write("m.bin", new)
        new_entry = await _entry(a, "m.bin")
        result = await b.http.fetch(a.peer, "models", new_entry, b.root())
        assert (b.root() / "m.bin").read_bytes() == new
        assert result.resumed_bytes == 0


async def test_changed_file_is_refused_and_nothing_installed(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("m.bin", os.urandom(3 * PIECE))
        stale = await _entry(a, "m.bin")
        a.write("m.bin", os.urandom(3 * PIECE))
        with pytest.raises(FileChangedError) as caught:
            await b.http.fetch(a.peer, "models", stale, b.root())
        assert caught.value.status == 412
        assert caught.value.current_hash == (await _entry(a, "m.bin")).hash
        assert not (b.root() / "m.bin").exists()
        (a.root() / "m.bin").unlink()
        with pytest.raises(FileChangedError) as gone:
            await b.http.fetch(a.peer, "models", stale, b.root())
        assert gone.value.status == 404


async def test_file_route_ranges_and_preconditions(tmp_path: Path) -> None:
    data = os.urandom(3000)
    async with FileNode(tmp_path / "a", "a") as a, aiohttp.ClientSession() as session:
        a.write("x.bin", data)
        digest = hashlib.sha256(data).hexdigest()
        url = f"{a.peer.url}/v1/sync/models/file"
        async with session.get(url, params={"path": "x.bin"}) as response:
            assert response.status == 200
            assert await response.read() == data
            assert response.headers["X-Shoal-Content-Hash"] == digest
        ranged = {"Range": "bytes=100-199"}
        async with session.get(url, params={"path": "x.bin"}, headers=ranged) as response:
            assert response.status == 206
            assert response.headers["Content-Range"] == "bytes 100-199/3000"
            assert await response.read() == data[100:200]
        tail = {"Range": "bytes=-10", "If-Match": f'"{digest}"'}
        async with session.get(url, params={"path": "x.bin"}, headers=tail) as response:
            assert response.status == 206
            assert await response.read() == data[-10:]
        for headers, params in [
            ({"If-Match": '"' + "0" * 64 + '"'}, {"path": "x.bin"}),
            ({}, {"path": "x.bin", "hash": "0" * 64}),
        ]:
            async with session.get(url, params=params, headers=headers) as response:
                assert response.status == 412
                assert response.headers["X-Shoal-Content-Hash"] == digest
                assert (await response.json())["error"] == "changed"
        for bad in ["bytes=5000-", "bytes=0-1,5-6", "items=1-2"]:
            async with session.get(
                url, params={"path": "x.bin"}, headers={"Range": bad}
            ) as response:
                assert response.status == 416
        async with session.get(url, params={"path": "missing.bin"}) as response:
            assert response.status == 404
        async with session.get(f"{a.peer.url}/v1/sync/games/file?path=x") as response:
            assert response.status == 404


async def test_bandwidth_limit_paces_the_download(tmp_path: Path) -> None:
    data = os.urandom(16 * PIECE)  # 256 KiB at 1 MiB/s: about 0.25 s after the burst
    options = {"bandwidth_bytes_per_s": 1 << 20}
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", transport_options=options) as b,
    ):
        a.write("m.bin", data)
        entry = await _entry(a, "m.bin")
        started = time.monotonic()
        await b.http.fetch(a.peer, "models", entry, b.root())
        assert time.monotonic() - started >= 0.15
        assert (b.root() / "m.bin").read_bytes() == data


async def test_a_locked_partial_is_busy(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("m.bin", os.urandom(PIECE))
        entry = await _entry(a, "m.bin")
        holder = await asyncio.to_thread(PartialFile.open, b.root(), entry.hash)
        try:
            with pytest.raises(TransferBusyError):
                await b.http.fetch(a.peer, "models", entry, b.root())
        finally:
            holder.close()
        await b.http.fetch(a.peer, "models", entry, b.root())


async def test_manifest_pages_and_etag_reuse(tmp_path: Path) -> None:
    async with FileNode(tmp_path / "a", "a") as a:
        for i in range(25):
            a.write(f"d/f{i:02d}", os.urandom(100))
        async with HttpTransport(timeouts=FAST_TIMEOUTS, page_limit=7) as http:
            first = await http.list_manifest(a.peer, "models", PIECE)
            assert [e.path for e in first.entries] == [f"d/f{i:02d}" for i in range(25)]
            again = await http.list_manifest(a.peer, "models", PIECE)
            assert again is first  # 304: the listing was not sent again
            a.write("d/f00", b"changed")
            changed = await http.list_manifest(a.peer, "models", PIECE)
            assert changed.etag != first.etag
            assert changed.entries[0].size == len(b"changed")
            one = await http.manifest_page(a.peer, "models", piece_size=PIECE, path="d/f03")
            assert [e.path for e in one.entries] == ["d/f03"]
            none = await http.manifest_page(a.peer, "models", piece_size=PIECE, path="nope")
            assert none.entries == ()


async def test_received_bytes_start_their_writeback_as_they_are_written(tmp_path: Path) -> None:
    """Every byte written to the partial file is handed to start_writeback once, at the
    offsets written (so the final fsync overlaps the transfer), and the file is intact."""
    data = os.urandom(6 * PIECE + 77)
    written: list[tuple[int, int]] = []
    real = start_writeback

    def record(fd: int, offset: int, count: int) -> None:
        assert os.pread(fd, count, offset) == data[offset : offset + count]
        written.append((offset, count))
        real(fd, offset, count)

    options = {"streams": 2, "parallel_min_bytes": 0}
    async with (
        FileNode(tmp_path / "a", "a") as a,
        FileNode(tmp_path / "b", "b", transport_options=options) as b,
    ):
        a.write("ckpt.pt", data)
        entry = await _entry(a, "ckpt.pt")
        with mock.patch.object(download_module, "start_writeback", record):
            await b.http.fetch(a.peer, "models", entry, b.root())
        assert (b.root() / "ckpt.pt").read_bytes() == data
    spans = sorted(written)
    assert spans[0][0] == 0
    assert all(s + n == start for (s, n), (start, _) in itertools.pairwise(spans))
    assert sum(count for _, count in spans) == len(data)


def test_start_writeback_is_best_effort(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(1 << 16))
    fd = os.open(path, os.O_RDWR)
    try:
        start_writeback(fd, 0, 1 << 16)  # a regular file: writeback starts, nothing to see
        start_writeback(fd, 0, 0)
    finally:
        os.close(fd)
    reader, writer = os.pipe()
    try:
        start_writeback(reader, 0, 10)  # a pipe cannot be synced: ignored, not raised
    finally:
        os.close(reader)
        os.close(writer)


def test_a_batch_of_many_small_chunks_is_written_whole(tmp_path: Path) -> None:
    """Many small received chunks in one batch all land at their offsets."""
    chunks = [os.urandom(7) for _ in range(3000)]
    data = b"".join(chunks)
    entry = ManifestEntry("f", len(data), 0, hashlib.sha256(data).hexdigest())
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        sink = PieceSink(fd, entry, PieceRun(0, 0), "peer")
        sink.store(chunks, sink.reserve(len(data)))
        sink.check(chunks)
        sink.finish()
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)


def test_a_large_chunk_is_written_in_pieces_of_write_bytes(tmp_path: Path) -> None:
    """A received chunk bigger than WRITE_BYTES is written by several calls of at most that
    many bytes (large single writes cost the kernel more), and lands whole."""
    data = os.urandom(3 * WRITE_BYTES + 5)  # chunks of 10 bytes and 3 * WRITE_BYTES - 5
    entry = ManifestEntry("f", len(data), 0, hashlib.sha256(data).hexdigest())
    sizes: list[int] = []
    real = os.pwrite

    def pwrite(fd: int, buffer: Any, offset: int) -> int:
        sizes.append(len(buffer))
        return real(fd, buffer, offset)

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        sink = PieceSink(fd, entry, PieceRun(0, 0), "peer")
        with mock.patch.object(os, "pwrite", pwrite):
            sink.store([data[:10], data[10:]], sink.reserve(len(data)))
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)
    assert sizes == [10, WRITE_BYTES, WRITE_BYTES, WRITE_BYTES - 5]
