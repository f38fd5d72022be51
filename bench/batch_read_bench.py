"""The event loop's share of a batch of small files (POST /v1/sync/{category}/files): the
client's BatchReceiver cutting --files frames out of an answer that arrives in 64 KiB pieces
(aiohttp's StreamReader, as the HTTP transport reads it), with installing replaced by a stub
so that only the reading is measured; beside it in the same run, the floor of reading the same
frames with three `readexactly` calls each (length, header, bytes) and nothing else.
Deterministic, so fit for instruction counts: run it under
`valgrind --tool=callgrind` at --rounds N and 2N and divide the difference by N x --files.
Prints JSON. Usage: python bench/batch_read_bench.py [--files 2000] [--rounds 20]
[--only receiver|readexactly]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sync.files.batch import HEADER, frame, hash_bytes, parse_header  # noqa: E402
from sync.files.manifest import DEFAULT_PIECE_SIZE, ManifestEntry  # noqa: E402
from sync.transports.batch_receiver import BatchReceiver  # noqa: E402
from sync.transports.protocol import PeerRef  # noqa: E402

PIECE_BYTES = 1 << 16
"""What one socket read hands the StreamReader (aiohttp's read_bufsize)."""


class Answer:
    """An answer body fed to aiohttp's StreamReader in pieces, read as net.aio's stream reads
    it: iter_chunks without a size (the pieces as received), or readexactly."""

    def __init__(self, body: bytes) -> None:
        protocol = mock.Mock(_reading_paused=False)
        self._reader = aiohttp.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
        for start in range(0, len(body), PIECE_BYTES):
            self._reader.feed_data(body[start : start + PIECE_BYTES])
        self._reader.feed_eof()

    async def iter_chunks(self, size: int | None = None) -> AsyncIterator[bytes]:
        async for chunk, _ in self._reader.iter_chunks():
            yield chunk

    async def readexactly(self, size: int) -> bytes:
        return await self._reader.readexactly(size)


def _batch(count: int) -> tuple[list[ManifestEntry], bytes]:
    """`count` files of 256 B - 2 KB (as sync_bench's small tree) and their framed answer."""
    rng = random.Random(15)
    entries: list[ManifestEntry] = []
    frames: list[bytes] = []
    for index in range(count):
        data = rng.randbytes(rng.randint(256, 2048))
        digest = hash_bytes(data, DEFAULT_PIECE_SIZE)
        entry = ManifestEntry(f"shard-{index % 20:02d}/game-{index:05d}.json", len(data), 1, digest)
        entries.append(entry)
        frames.append(frame({"path": entry.path, "size": entry.size, "hash": digest}, data))
    return entries, b"".join(frames)


async def _receiver(root: Path, entries: Sequence[ManifestEntry], body: bytes) -> None:
    receiver = BatchReceiver(PeerRef("src", "http://127.0.0.1:9"), "http", "t", entries, root)
    stat = os.stat(root)

    def install(items: list[Any]) -> list[Any]:
        return [stat] * len(items)

    def finish(fsync_dir: Any = None) -> None:
        return None

    writer: Any = receiver._writer  # installing stubbed: only the reading is measured
    writer.install, writer.finish = install, finish
    await receiver.read(Answer(body))
    await receiver.install_rest()
    await receiver.close()
    assert len(receiver.results) == len(entries)


async def _readexactly(entries: Sequence[ManifestEntry], body: bytes) -> None:
    answer = Answer(body)
    for _ in entries:
        (length,) = HEADER.unpack(await answer.readexactly(HEADER.size))
        header = parse_header(await answer.readexactly(length))
        await answer.readexactly(header["size"])


async def _run(files: int, rounds: int, only: str | None) -> dict[str, Any]:
    entries, body = _batch(files)
    result: dict[str, Any] = {"files": files, "rounds": rounds, "answer_bytes": len(body)}
    with tempfile.TemporaryDirectory(prefix="batch-read-bench-") as temp:
        for name in ("receiver", "readexactly"):
            if only not in (None, name):
                continue
            started = time.process_time()
            for _ in range(rounds):
                if name == "receiver":
                    await _receiver(Path(temp), entries, body)
                else:
                    await _readexactly(entries, body)
            spent = time.process_time() - started
            result[f"{name}_cpu_us_per_file"] = round(spent / rounds / files * 1e6, 2)
    if only is None:
        result["receiver_vs_readexactly_cpu"] = round(
            result["receiver_cpu_us_per_file"] / result["readexactly_cpu_us_per_file"], 2
        )
    result["load_avg_1m"] = round(os.getloadavg()[0], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", choices=("receiver", "readexactly"), default=None)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_run(args.files, args.rounds, args.only)), indent=2))


if __name__ == "__main__":
    main()
