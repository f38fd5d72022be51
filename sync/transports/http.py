"""The HTTP transport: manifests, resumable verified file downloads with range requests, and
pull requests ("please pull this file from me") to peers' file sync endpoints.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from config import Timeouts
from config.closing import AsyncClosing
from net import Identity, NetError, PeerClient, PeerTls
from sync.errors import (
    ContentMismatchError,
    FileSyncError,
    FileTransferError,
    ManifestError,
)
from sync.files.download import RateLimiter, download_run, plan_runs
from sync.files.manifest import ManifestEntry, ManifestPage, parse_page
from sync.files.tombstones import Tombstone, parse_tombstones
from sync.guards import dest_path
from sync.translate import sync_error
from sync.transports.batch_receiver import BatchReceiver
from sync.transports.partial import (
    install_file,
    make_directories,
    open_partial,
    run_blocking,
    verify_present_pieces,
)
from sync.transports.protocol import PeerRef, TransferResult

logger = logging.getLogger(__name__)

PREFIX = "/v1/sync"
DEFAULT_PAGE_LIMIT = 10_000
READ_BUFFER_BYTES = 4 << 20


@dataclass(frozen=True)
class RemoteManifest:
    """A peer's whole manifest of one category, as read page by page."""

    peer: str
    category: str
    entries: tuple[ManifestEntry, ...]
    etag: str
    shared_id: str | None
    tombstones: tuple[Tombstone, ...] = ()


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


def category_path(category: str, leaf: str) -> str:
    """The path of a category's file sync route `leaf` on any peer."""
    return f"{PREFIX}/{quote(category, safe='')}/{leaf}"


def category_url(peer: PeerRef, category: str, leaf: str) -> str:
    return f"{peer.url.rstrip('/')}{category_path(category, leaf)}"


class HttpTransport(AsyncClosing):
    """Fetches files from peers' `GET /v1/sync/{category}/file` (owns one net.PeerClient, a
    kept-alive session per peer; async context manager, close() idempotent and final).

    Requests are signed when `secret` is set and name `cluster` (X-Shoal-Cluster) when set.
    `streams` range requests run at once for a file of at least `parallel_min_bytes`;
    `bandwidth_bytes_per_s` caps all downloads together. `tls` is net's per-peer TLS choice
    (a node's peer_tls), None: plain http.
    """

    name = "http"

    def __init__(
        self,
        *,
        node_id: str = "",
        secret: bytes | None = None,
        timeouts: Timeouts | None = None,
        bandwidth_bytes_per_s: float | None = None,
        streams: int = 2,
        parallel_min_bytes: int = 64 << 20,
        page_limit: int = DEFAULT_PAGE_LIMIT,
        cluster: str | None = None,
        tls: PeerTls | None = None,
    ) -> None:
        self._timeouts = timeouts if timeouts is not None else Timeouts()
        self._tls = tls
        self._node_id = node_id or "shoal"
        self._secret = secret
        self._cluster = cluster
        self._limiter = RateLimiter(bandwidth_bytes_per_s) if bandwidth_bytes_per_s else None
        self._streams = max(1, streams)
        self._parallel_min_bytes = parallel_min_bytes
        self._page_limit = page_limit
        self._client: PeerClient | None = None
        self._state = _State.UNOPENED
        self._manifests: dict[tuple[str, str], RemoteManifest] = {}

    async def _enter(self) -> None:
        self.peers()

    @property
    def download_limiter(self) -> RateLimiter | None:
        """The cap of every download through this transport (None: unlimited)."""
        return self._limiter

    def peers(self) -> PeerClient:
        """The transport's open peer client (for transports built on it); FileSyncError once
        closed."""
        if self._state is _State.CLOSED:
            raise FileSyncError("HTTP transport is closed")
        if self._client is None:
            self._client = PeerClient(
                Identity(self._secret, self._node_id, self._cluster),
                timeouts=self._timeouts,
                tls=self._tls,
                auto_decompress=False,
                read_bufsize=READ_BUFFER_BYTES,
            )
            self._state = _State.OPEN
        return self._client

    async def close(self) -> None:
        """Close the peer client; idempotent. The transport cannot be used afterwards."""
        self._state = _State.CLOSED
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def fetch(
        self, peer: PeerRef, category: str, entry: ManifestEntry, dest_root: Path
    ) -> TransferResult:
        """Install `entry` from `peer` at `dest_root`/`entry.path` (see Transport)."""
        try:
            return await self._fetch(peer, category, entry, dest_root)
        except OSError as exc:
            raise FileSyncError(f"{category}/{entry.path}: local file error: {exc}") from exc

    async def _fetch(
        self, peer: PeerRef, category: str, entry: ManifestEntry, dest_root: Path
    ) -> TransferResult:
        client = self.peers()
        started = time.monotonic()
        final = dest_path(dest_root, entry.path)
        await asyncio.to_thread(make_directories, dest_root, final.parent)
        partial = await open_partial(final.parent, entry.hash)
        try:
            verified = await run_blocking(verify_present_pieces, partial.fd, entry)
            resumed = sum(entry.piece_span(i)[1] for i, ok in enumerate(verified) if ok)
            streams = self._streams if entry.size >= self._parallel_min_bytes else 1
            runs = plan_runs(verified, streams)
            piece_s = self._timeouts.sync_piece_s
            jobs = [
                download_run(
                    client,
                    peer.url,
                    category_path(category, "file"),
                    entry,
                    run,
                    partial.fd,
                    peer.node_id,
                    piece_s * (run.last - run.first + 1),
                    self._limiter,
                    read_timeout_s=piece_s,
                )
                for run in runs
            ]
            try:
                received = sum(await _gather_or_cancel(jobs))
            except ContentMismatchError:
                if entry.piece_count == 1:
                    await run_blocking(partial.discard)
                raise
            await run_blocking(install_file, partial.path, final, entry, partial.fd, True)
        finally:
            partial.close()
        if resumed:
            logger.info(
                "%s/%s: resumed with %d bytes already verified", category, entry.path, resumed
            )
        return TransferResult.installed(
            peer, self.name, category, entry, transferred=received, resumed=resumed, started=started
        )

    async def fetch_batch(
        self,
        peer: PeerRef,
        category: str,
        entries: Sequence[ManifestEntry],
        dest_root: Path,
        on_installed: Callable[[ManifestEntry, os.stat_result], None] | None = None,
    ) -> dict[str, TransferResult | FileSyncError]:
        """Install many small files from `peer` with one request (`POST .../files`, a framed
        stream; see sync.files.batch): each verified, fsynced and renamed into place, each
        directory fsynced once at the end. Returns per path its result or the error that kept
        it out (fetch those alone). FileTransferError when the request itself fails: files
        installed before that stay (each is complete and verified; only the directory fsync
        of the batch is then done before raising)."""
        client = self.peers()
        receiver = BatchReceiver(
            peer, self.name, category, entries, dest_root, on_installed, self._limiter
        )
        body = {"files": [{"path": entry.path, "hash": entry.hash} for entry in entries]}
        timeout_s = self._timeouts.sync_s
        try:
            async with (
                asyncio.timeout(timeout_s),
                client.stream(
                    "POST",
                    peer.url,
                    category_path(category, "files"),
                    json=body,
                    headers={"Accept-Encoding": "identity"},
                    timeout_s=self._timeouts.sync_piece_s,
                    check=False,
                ) as stream,
            ):
                if stream.status != 200:
                    payload = await stream.read()
                    raise FileTransferError(
                        f"{peer.node_id}: batch of {len(entries)} files refused: HTTP "
                        f"{stream.status}: {_reason(payload)}",
                        stream.status,
                    )
                await receiver.read(stream)
            await receiver.install_rest()
        except (NetError, TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            await receiver.flush()
            raise sync_error(
                exc, f"{peer.node_id}: batch of {len(entries)} files", FileTransferError
            ) from exc
        except FileSyncError:
            await receiver.flush()  # report the files already installed before the stream went bad
            raise
        finally:
            await receiver.close()
        return receiver.results

    async def _get_json(
        self,
        peer: PeerRef,
        path: str,
        params: dict[str, str],
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        url = f"{peer.url.rstrip('/')}{path}"
        try:
            answer = await self.peers().request(
                "GET", peer.url, path, params=params, headers=headers,
                timeout_s=self._timeouts.sync_s, check=False,
            )  # fmt: skip
            if answer.status == 304:
                return 304, None
            if answer.status != 200:
                raise FileTransferError(
                    f"{url}: HTTP {answer.status}: {_reason(answer.body)}", answer.status
                )
            return 200, json.loads(answer.body)
        except NetError as exc:
            raise sync_error(exc, url, FileTransferError) from exc
        except ValueError as exc:
            raise ManifestError(f"{url}: answer is not JSON: {exc}") from exc

    async def manifest_page(
        self,
        peer: PeerRef,
        category: str,
        after: str | None = None,
        piece_size: int | None = None,
        path: str | None = None,
    ) -> ManifestPage:
        """One page of a peer's manifest (or the entry of one `path`)."""
        params = {"limit": str(self._page_limit)}
        if after is not None:
            params["after"] = after
        if path is not None:
            params["path"] = path
        _, data = await self._get_json(peer, category_path(category, "manifest"), params)
        return parse_page(data, piece_size)

    async def list_manifest(
        self, peer: PeerRef, category: str, piece_size: int | None = None
    ) -> RemoteManifest:
        """A peer's whole manifest of `category`; unchanged since the last call (same etag),
        the previous listing is reused without transferring it again."""
        key = (peer.node_id, category)
        cached = self._manifests.get(key)
        path = category_path(category, "manifest")
        headers = {"If-None-Match": f'"{cached.etag}"'} if cached is not None else None
        status, data = await self._get_json(peer, path, {"limit": str(self._page_limit)}, headers)
        if status == 304 and cached is not None:
            return cached
        page = parse_page(data, piece_size)
        tombstones = parse_tombstones(data)
        entries = list(page.entries)
        etags = {page.etag}
        while page.next is not None:
            page = await self.manifest_page(peer, category, page.next, piece_size)
            entries.extend(page.entries)
            etags.add(page.etag)
        listing = RemoteManifest(
            peer.node_id, category, tuple(entries), page.etag, page.shared_id, tombstones
        )
        if len(etags) == 1 and page.etag:
            self._manifests[key] = listing
        else:
            self._manifests.pop(key, None)
        return listing

    async def request_pull(
        self,
        peer: PeerRef,
        category: str,
        path: str,
        content_hash: str,
        source: PeerRef,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Ask `peer` to pull `path` (version `content_hash`) from `source`, sending `headers`
        (the plan's fence); returns its answer once the file is installed there.
        FileTransferError carries the refusal status."""
        url = category_url(peer, category, "pull")
        body = {"peer": source.to_json(), "path": path, "hash": content_hash}
        try:
            response = await self.peers().request(
                "POST", peer.url, category_path(category, "pull"), json=body, headers=headers,
                timeout_s=self._timeouts.sync_s + self._timeouts.http_request_s, check=False,
            )  # fmt: skip
            if response.status != 200:
                raise FileTransferError(
                    f"{peer.node_id}: pull of {path} refused: HTTP {response.status}: "
                    f"{_reason(response.body)}",
                    response.status,
                )
            answer = json.loads(response.body)
        except NetError as exc:
            raise sync_error(exc, url, FileTransferError) from exc
        except ValueError as exc:
            raise FileTransferError(f"{url}: answer is not JSON") from exc
        if not isinstance(answer, dict):
            raise FileTransferError(f"{url}: answer is not a JSON object")
        return answer


def _reason(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300]
    if isinstance(data, dict):
        return str(data.get("reason") or data.get("error") or data)[:300]
    return str(data)[:300]


async def _gather_or_cancel(jobs: list[Any]) -> list[int]:
    """Run the download jobs together; the first failure cancels the rest (awaited) and is
    raised as itself, not as a group."""
    if len(jobs) == 1:
        return [await jobs[0]]
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
