"""The receiving end of a batch: frames cut from the answer's pieces wherever the pieces split
them, refused frames recorded per file, and a stream that breaks the framing refused."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sync.errors import FileChangedError, FileSyncError, FileTransferError
from sync.files.batch import HEADER, frame, hash_bytes
from sync.files.manifest import ManifestEntry
from sync.transports.batch_receiver import BatchReceiver
from sync.transports.protocol import PeerRef, TransferResult
from tests.sync.files_fixtures import PIECE

PEER = PeerRef("src", "http://127.0.0.1:9")


class Pieces:
    """An answer body handed out in pieces of the given sizes (the rest in one)."""

    def __init__(self, body: bytes, sizes: list[int]) -> None:
        self._body = body
        self._sizes = sizes

    async def iter_chunks(self, size: int | None = None) -> AsyncIterator[bytes]:
        body = self._body
        for step in self._sizes:
            if not body:
                return
            yield body[:step]
            body = body[step:]
            await asyncio.sleep(0)
        if body:
            yield body


def _files(count: int) -> tuple[list[ManifestEntry], dict[str, bytes]]:
    rng = random.Random(3)
    entries, data = [], {}
    for index in range(count):
        path = f"d{index % 3}/f{index}.bin"
        blob = rng.randbytes(rng.randint(0, 300))
        entries.append(ManifestEntry(path, len(blob), 10**18, hash_bytes(blob, PIECE), (), PIECE))
        data[path] = blob
    return entries, data


def _body(entries: list[ManifestEntry], data: dict[str, bytes]) -> bytes:
    return b"".join(
        frame({"path": e.path, "size": e.size, "hash": e.hash}, data[e.path]) for e in entries
    )


async def _receive(root: Path, entries: list[ManifestEntry], stream: Pieces) -> BatchReceiver:
    receiver = BatchReceiver(PEER, "http", "training", entries, root)
    try:
        await receiver.read(stream)
        await receiver.install_rest()
    finally:
        await receiver.close()
    return receiver


@pytest.mark.parametrize("piece", [1, 7, 4096])
async def test_frames_split_anywhere_are_installed(tmp_path: Path, piece: int) -> None:
    entries, data = _files(40)
    stream = Pieces(_body(entries, data), [piece] * 100_000)
    receiver = await _receive(tmp_path / f"root-{piece}", entries, stream)
    assert all(isinstance(r, TransferResult) for r in receiver.results.values())
    assert len(receiver.results) == len(entries)
    for path, blob in data.items():
        assert (tmp_path / f"root-{piece}" / path).read_bytes() == blob


async def test_a_refused_file_is_recorded_and_the_next_frame_still_read(tmp_path: Path) -> None:
    entries, data = _files(3)
    refused = frame({"path": entries[1].path, "error": "changed", "status": 412, "reason": "new"})
    body = frame(
        {"path": entries[0].path, "size": entries[0].size, "hash": entries[0].hash},
        data[entries[0].path],
    )
    body += refused + _body(entries[2:], data)
    receiver = await _receive(tmp_path, entries, Pieces(body, [5] * 1000))
    error = receiver.results[entries[1].path]
    assert isinstance(error, FileChangedError)
    assert error.status == 412
    assert isinstance(receiver.results[entries[2].path], TransferResult)


async def test_an_answer_that_ends_early_is_an_incomplete_read(tmp_path: Path) -> None:
    entries, data = _files(4)
    body = _body(entries, data)
    with pytest.raises(asyncio.IncompleteReadError):
        await _receive(tmp_path, entries, Pieces(body[:-3], [64] * 100))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("unknown", "batch sent 'nobody/asked.bin'"),
        ("unknown-huge", "batch sent 'nobody/asked.bin'"),
        ("no-size", "None bytes announced, expected"),
        ("size", "bytes announced, expected"),
        ("header", "batch header of"),
    ],
)
async def test_a_stream_that_breaks_the_framing_is_refused(
    tmp_path: Path, bad: str, message: str
) -> None:
    entries, data = _files(2)
    first = entries[0]
    if bad.startswith("unknown"):
        # refused when its header arrives, not after the bytes it announces (which never come)
        size = 1 << 30 if bad == "unknown-huge" else 1
        body = frame({"path": "nobody/asked.bin", "size": size, "hash": first.hash}, b"x")
    elif bad == "no-size":
        body = frame({"path": first.path, "hash": first.hash}, data[first.path])
    elif bad == "size":
        blob = data[first.path] + b"extra"
        body = frame({"path": first.path, "size": len(blob), "hash": first.hash}, blob)
    else:
        body = HEADER.pack(1 << 20) + b"{}"
    with pytest.raises(FileTransferError, match=message):
        await _receive(tmp_path, entries, Pieces(body + _body(entries, data), [3] * 1000))


async def test_a_header_that_is_not_json_is_refused(tmp_path: Path) -> None:
    entries, data = _files(1)
    body = HEADER.pack(5) + b"nope!" + _body(entries, data)
    with pytest.raises(FileSyncError, match="batch frame header is not JSON"):
        await _receive(tmp_path, entries, Pieces(body, [2] * 1000))
