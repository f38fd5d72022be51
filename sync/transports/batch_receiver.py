"""The receiving end of a batch (`POST /v1/sync/{category}/files`): reads the framed stream
(sync.files.batch) and installs its files in groups on a worker thread while the next arrive.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
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
    """What a batch is read from: an HTTP answer's body (aiohttp's StreamReader)."""

    async def readexactly(self, n: int) -> bytes: ...


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

    async def read(self, stream: ByteStream) -> None:
        """Read one frame per file asked for; a full group goes to the worker thread while the
        next frames arrive. FileTransferError when the stream breaks the framing."""
        node = self._peer.node_id
        for _ in range(len(self._entries)):
            (length,) = HEADER.unpack(await stream.readexactly(HEADER.size))
            if length > MAX_HEADER_BYTES:
                raise FileTransferError(f"{node}: batch header of {length} bytes")
            header = parse_header(await stream.readexactly(length))
            entry = self._wanted.get(header["path"])
            if entry is None or header["path"] in self.results:
                raise FileTransferError(f"{node}: batch sent {header['path']!r}")
            if "error" in header:
                status = header.get("status")
                reason = header.get("reason", header["error"])
                self.results[entry.path] = FileChangedError(
                    f"{node}: {entry.path}: {reason}",
                    status if isinstance(status, int) else 409,
                )
                continue
            if header["size"] != entry.size:
                raise FileTransferError(
                    f"{node}: {entry.path}: {header['size']} bytes announced, expected {entry.size}"
                )
            data = await stream.readexactly(entry.size)
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
