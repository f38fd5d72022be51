"""Downloading runs of pieces over HTTP range requests into a partial file: bytes are written
and hashed in a worker thread while the next batch arrives, and each piece is checked against
its manifest hash the moment it is complete.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from net import NetError, PeerClient, PeerStream
from sync.errors import (
    ContentMismatchError,
    FileChangedError,
    FileSyncError,
    FileTransferError,
    PathRefusedError,
)
from sync.files.manifest import ManifestEntry
from sync.translate import sync_error
from sync.transports.partial import await_jobs, settle_all, start_writeback

BATCH_BYTES = 1 << 20  # measured: bigger batches fall out of the CPU cache between write and hash
WRITE_BYTES = 256 << 10
"""Bytes per write call. Measured here (ext4, kernel 6.18): writes of 1 MiB or more cost the
kernel twice the CPU of 256-512 KiB writes to copy into the page cache (dd bs=4M is slower
than rsync's 32 KiB writes for that reason)."""
HASH_HEADER = "X-Shoal-Content-Hash"

ReceivedFn = Callable[[int], None]
RECEIVED: contextvars.ContextVar[ReceivedFn | None] = contextvars.ContextVar(
    "shoal_sync_received", default=None
)
"""Told the size of each batch of file bytes as it is written (set by whoever shows progress
for the transfer running in this context; a run's tasks inherit it)."""


class RateLimiter:
    """A token bucket shared by the transfers of one transport: `take(n)` waits until n bytes
    fit in `bytes_per_s`."""

    def __init__(self, bytes_per_s: float, burst_bytes: int | None = None) -> None:
        if not bytes_per_s > 0:
            raise ValueError(f"bandwidth limit must be positive, got {bytes_per_s}")
        self.bytes_per_s = float(bytes_per_s)
        self._capacity = float(burst_bytes or max(64 << 10, int(bytes_per_s / 20)))
        self._tokens = self._capacity
        self._last = time.monotonic()

    async def take(self, count: int) -> None:
        now = time.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self.bytes_per_s)
        self._last = now
        self._tokens -= count
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.bytes_per_s)


@dataclass(frozen=True)
class PieceRun:
    """Consecutive pieces `first`..`last` (inclusive) fetched with one range request."""

    first: int
    last: int

    def span(self, entry: ManifestEntry) -> tuple[int, int]:
        """(start offset, end offset exclusive) of the run in the file."""
        start = entry.piece_span(self.first)[0]
        offset, length = entry.piece_span(self.last)
        return start, offset + length


def plan_runs(verified: list[bool], streams: int) -> list[PieceRun]:
    """Runs of the pieces not yet verified, cut so that up to `streams` requests of similar
    size can run at once."""
    missing = [index for index, ok in enumerate(verified) if not ok]
    if not missing:
        return []
    share = max(1, -(-len(missing) // max(1, streams)))
    runs: list[PieceRun] = []
    first = previous = missing[0]
    for index in missing[1:]:
        if index != previous + 1 or previous - first + 1 >= share:
            runs.append(PieceRun(first, previous))
            first = index
        previous = index
    runs.append(PieceRun(first, previous))
    return runs


class PieceSink:
    """Writes a run's bytes at their offsets in the partial file (starting their writeback to
    disk at once, so flushing overlaps the transfer) and checks each piece as it completes.
    `store` and `check` block; a batch is stored and checked in two worker threads at once,
    and at most one `check` runs at a time (the hash state is sequential)."""

    def __init__(self, fd: int, entry: ManifestEntry, run: PieceRun, peer: str) -> None:
        self._fd = fd
        self._entry = entry
        self._expected = entry.piece_hashes()
        self._peer = peer
        self._piece = run.first
        self._last = run.last
        self._offset, self._end = run.span(entry)
        self._hasher = hashlib.sha256()
        self._in_piece = 0
        self.verified = 0

    def reserve(self, total: int) -> int:
        """The file offset of the next `total` bytes (on the event loop, before storing)."""
        if self._offset + total > self._end:
            raise FileTransferError(f"{self._entry.path}: peer sent more bytes than asked for")
        offset = self._offset
        self._offset += total
        return offset

    def store(self, chunks: list[bytes], offset: int) -> None:
        at = offset
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                for start in range(0, len(view), WRITE_BYTES):
                    piece = view[start : start + WRITE_BYTES]
                    done = 0
                    while done < len(piece):
                        done += os.pwrite(self._fd, piece[done:], at + done)
                    at += len(piece)
            start_writeback(self._fd, offset, at - offset)
        except OSError as exc:
            message = f"{self._entry.path}: cannot write the partial file: {exc}"
            raise FileSyncError(message) from exc

    def check(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self._feed(memoryview(chunk))

    def _feed(self, view: memoryview) -> None:
        position = 0
        while position < len(view):
            length = self._entry.piece_span(self._piece)[1]
            take = min(len(view) - position, length - self._in_piece)
            self._hasher.update(view[position : position + take])
            position += take
            self._in_piece += take
            if self._in_piece == length:
                self._complete()

    def _complete(self) -> None:
        got = self._hasher.hexdigest()
        if got != self._expected[self._piece]:
            raise ContentMismatchError(
                f"{self._entry.path}: piece {self._piece} from {self._peer} hashed to "
                f"{got[:16]}, expected {self._expected[self._piece][:16]}",
                self._peer,
                self._piece,
            )
        self.verified += 1
        self._piece += 1
        self._hasher = hashlib.sha256()
        self._in_piece = 0

    def finish(self) -> None:
        """Check that the whole run arrived (an empty piece needs no bytes)."""
        if self._piece == self._last and self._entry.piece_span(self._piece)[1] == 0:
            self._complete()
        if self._piece <= self._last:
            raise FileTransferError(
                f"{self._entry.path}: connection ended at byte {self._offset} of {self._end}"
            )


def _submit(sink: PieceSink, batch: list[bytes], offset: int) -> list[asyncio.Future[None]]:
    loop = asyncio.get_running_loop()
    return [
        loop.run_in_executor(None, sink.store, batch, offset),
        loop.run_in_executor(None, sink.check, batch),
    ]


def _refusal(response: PeerStream, entry: ManifestEntry, peer: str) -> Exception:
    status = response.status
    where = f"{peer}: {entry.path}"
    if status == 412:
        current = response.headers.get(HASH_HEADER)
        return FileChangedError(f"{where}: file changed on the peer", 412, current)
    if status == 404:
        return FileChangedError(f"{where}: the peer no longer has this file", 404)
    if status == 400:
        return PathRefusedError(entry.path, f"refused by {peer}")
    return FileTransferError(f"{where}: unexpected HTTP {status}", status)


def _check_answer(response: PeerStream, entry: ManifestEntry, run: PieceRun, peer: str) -> None:
    start, end = run.span(entry)
    if response.status not in (200, 206):
        raise _refusal(response, entry, peer)
    announced = response.headers.get(HASH_HEADER)
    if announced is not None and announced != entry.hash:
        raise FileChangedError(f"{peer}: {entry.path}: file changed on the peer", 412, announced)
    if response.status == 200:
        if start != 0 or end != entry.size:
            raise FileTransferError(f"{peer}: {entry.path}: range ignored (HTTP 200)", 200)
        return
    expected = f"bytes {start}-{end - 1}/{entry.size}"
    if response.headers.get("Content-Range") != expected:
        raise FileTransferError(
            f"{peer}: {entry.path}: Content-Range {response.headers.get('Content-Range')!r}, "
            f"expected {expected!r}",
            206,
        )


async def download_run(
    client: PeerClient,
    peer_url: str,
    file_path: str,
    entry: ManifestEntry,
    run: PieceRun,
    fd: int,
    peer: str,
    timeout_s: float,
    limiter: RateLimiter | None = None,
    *,
    read_timeout_s: float | None = None,
) -> int:
    """Fetch one run of pieces of the file route `file_path` of the peer at `peer_url` into
    `fd`; returns the bytes received. Raises ContentMismatchError
    at the first bad piece, FileChangedError, PathRefusedError or FileTransferError. The whole
    run has `timeout_s`; connecting and each read `read_timeout_s` (default: the same)."""
    start, end = run.span(entry)
    headers = {"If-Match": f'"{entry.hash}"', "Accept-Encoding": "identity"}
    if end > start:
        headers["Range"] = f"bytes={start}-{end - 1}"
    params = {"path": entry.path, "hash": entry.hash}
    sink = PieceSink(fd, entry, run, peer)
    jobs: list[asyncio.Future[None]] = []
    received = 0
    batch: list[bytes] = []
    report = RECEIVED.get()
    try:
        async with (
            asyncio.timeout(timeout_s),
            client.stream(
                "GET", peer_url, file_path, params=params, headers=headers,
                timeout_s=read_timeout_s or timeout_s, check=False,
            ) as response,
        ):  # fmt: skip
            _check_answer(response, entry, run, peer)
            batch_bytes = 0
            # chunks as received: iter_any would join what is buffered (a copy of every byte)
            async for chunk in response.iter_chunks():
                if limiter is not None:
                    await limiter.take(len(chunk))
                batch.append(chunk)
                batch_bytes += len(chunk)
                received += len(chunk)
                if batch_bytes >= BATCH_BYTES:
                    await await_jobs(jobs)
                    jobs = _submit(sink, batch, sink.reserve(batch_bytes))
                    if report is not None:
                        report(batch_bytes)
                    batch, batch_bytes = [], 0
            await await_jobs(jobs)
            jobs = []
            if batch:
                await await_jobs(_submit(sink, batch, sink.reserve(batch_bytes)))
                batch = []
            sink.finish()
    except (NetError, TimeoutError, OSError) as exc:
        await await_jobs(jobs)
        jobs = []
        if batch:  # keep what arrived: its complete pieces are verified now, not fetched again
            total = sum(len(chunk) for chunk in batch)
            await await_jobs(_submit(sink, batch, sink.reserve(total)))
        raise sync_error(
            exc, f"{peer}: {entry.path}: after {received} bytes", FileTransferError
        ) from exc
    finally:
        await settle_all(jobs)
    return received
