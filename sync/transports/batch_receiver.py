"""The receiving end of a batch (`POST /v1/sync/{category}/files`): reads the framed stream
(sync.files.batch) and installs its files in groups on a worker thread while the next arrive.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from sync.errors import FileChangedError, FileSyncError, FileTransferError
from sync.files.batch import HEADER, MAX_HEADER_BYTES, BatchWriter, parse_header
from sync.files.download import RateLimiter
from sync.files.manifest import ManifestEntry
from sync.transports.partial import await_jobs, run_blocking, settle_all
from sync.transports.protocol import PeerRef, TransferResult

BATCH_GROUP_BYTES = 1 << 20
BATCH_GROUP_FILES = 64
"""Files installed in one worker-thread call: at most this many, or about this many bytes."""


class ByteStream(Protocol):
    """What a batch is read from: an HTTP answer's body, in pieces as they arrive."""

    def iter_chunks(self, size: int | None = None) -> AsyncIterator[bytes]: ...


class BatchReceiver:
    """Installs the files of one batch answer under `dest_root`, each verified, fsynced and
    renamed into place; `results` holds per path its TransferResult or the FileSyncError that
    kept it out. `close()` (always, in `finally`) waits for the installs in flight and fsyncs
    the directories once."""

    def __init__(
        self,
        peer: PeerRef,
        transport: str,
        category: str,
        entries: Sequence[ManifestEntry],
        dest_root: Path,
        on_installed: Callable[[ManifestEntry, os.stat_result], None] | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.results: dict[str, TransferResult | FileSyncError] = {}
        self._peer = peer
        self._transport = transport
        self._category = category
        self._entries = entries
        self._wanted = {entry.path: entry for entry in entries}
        self._on_installed = on_installed
        self._limiter = limiter
        self._started = time.monotonic()
        self._writer = BatchWriter.at(dest_root)
        self._jobs: list[asyncio.Future[list[os.stat_result | FileSyncError]]] = []
        self._pending: list[tuple[ManifestEntry, bytes]] = []
        self._group: list[tuple[ManifestEntry, bytes]] = []
        self._group_bytes = 0
        self._header: dict[str, Any] = {}
        self._header_end: int | None = None
        self._size = 0

    async def read(self, stream: ByteStream) -> None:
        """Read one frame per file asked for; a full group goes to the worker thread while the
        next frames arrive. FileTransferError when the stream breaks the framing,
        asyncio.IncompleteReadError when it ends early.

        Frames are cut from the pieces of the body as they arrive (tens of frames per piece),
        not read one field at a time: three awaited reads per file cost more than the file."""
        buffer = bytearray()
        start = 0
        wanted = len(self._entries)
        async for piece in stream.iter_chunks():
            buffer += piece
            while wanted:
                end = self._frame_end(buffer, start)
                if end is None:
                    break
                await self._take(buffer, end)
                start, wanted = end, wanted - 1
            if not wanted:
                return
            if start:
                del buffer[:start]
                if self._header_end is not None:
                    self._header_end -= start
                start = 0
        if wanted:
            raise asyncio.IncompleteReadError(bytes(buffer), None)

    def _frame_end(self, buffer: bytearray, start: int) -> int | None:
        """Where the frame at `start` ends, or None while it is incomplete (its header is
        parsed and checked once, as soon as it is complete)."""
        if self._header_end is None:
            if len(buffer) - start < HEADER.size:
                return None
            (length,) = HEADER.unpack_from(buffer, start)
            if length > MAX_HEADER_BYTES:
                raise FileTransferError(f"{self._peer.node_id}: batch header of {length} bytes")
            if len(buffer) < start + HEADER.size + length:
                return None
            self._header_end = start + HEADER.size + length
            self._header = parse_header(bytes(buffer[start + HEADER.size : self._header_end]))
            self._size = self._body_size(self._header)
        end = self._header_end + self._size
        return end if len(buffer) >= end else None

    def _body_size(self, header: dict[str, Any]) -> int:
        """The bytes that follow `header`: none for a refused file. FileTransferError for a
        file not asked for (or sent twice) or a size that is not the manifest's."""
        node = self._peer.node_id
        entry = self._wanted.get(header["path"])
        if entry is None or header["path"] in self.results:
            raise FileTransferError(f"{node}: batch sent {header['path']!r}")
        if "error" in header:
            return 0
        if header.get("size") != entry.size:
            raise FileTransferError(
                f"{node}: {entry.path}: {header.get('size')} bytes announced, expected {entry.size}"
            )
        return entry.size

    async def _take(self, buffer: bytearray, end: int) -> None:
        """Record or queue the file of the complete (and checked) frame that ends at `end`."""
        header, self._header_end = self._header, None
        entry = self._wanted[header["path"]]
        if "error" in header:
            status = header.get("status")
            reason = header.get("reason", header["error"])
            self.results[entry.path] = FileChangedError(
                f"{self._peer.node_id}: {entry.path}: {reason}",
                status if isinstance(status, int) else 409,
            )
            return
        data = bytes(buffer[end - entry.size : end])
        if self._limiter is not None:
            await self._limiter.take(len(data))
        self._group.append((entry, data))
        self._group_bytes += len(data)
        if self._group_bytes >= BATCH_GROUP_BYTES or len(self._group) >= BATCH_GROUP_FILES:
            await self.flush()
            loop = asyncio.get_running_loop()
            self._jobs = [loop.run_in_executor(None, self._writer.install, self._group)]
            self._pending, self._group, self._group_bytes = self._group, [], 0

    async def install_rest(self) -> None:
        """Once the stream is read: wait for the group in flight, then install the last one."""
        await self.flush()
        if self._group:
            self._pending = self._group
            self._settle(self._pending, await run_blocking(self._writer.install, self._group))
            self._pending = self._group = []

    async def flush(self) -> None:
        """Wait for the group in flight and record its results (so the files already installed
        are reported when the stream fails)."""
        if self._jobs:
            self._settle(self._pending, (await await_jobs(self._jobs))[0])
            self._jobs, self._pending = [], []

    async def close(self) -> None:
        """Wait for any install in flight, then fsync each directory of the batch once."""
        await settle_all(self._jobs)
        await run_blocking(self._writer.finish)

    def _settle(self, done: list[tuple[ManifestEntry, bytes]], results: list[Any]) -> None:
        for (entry, data), result in zip(done, results, strict=True):
            if isinstance(result, FileSyncError):
                self.results[entry.path] = result
                continue
            self.results[entry.path] = TransferResult.installed(
                self._peer,
                self._transport,
                self._category,
                entry,
                transferred=len(data),
                resumed=0,
                started=self._started,
            )
            if self._on_installed is not None:
                self._on_installed(entry, result)
