"""HTTP routes of file sync: paged manifests, file bytes with ranges guarded by the content hash,
and pull requests from peers that push. Refusals are JSON `{"error": code, "reason": text,
"status": N}` (config.wire).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from config import error_response
from config.declare import Caller, Refusal, route, route_defs
from sync.files.batch import MAX_BATCH_FILES, read_served_file
from sync.files.catalog import FileCatalog
from sync.files.download import HASH_HEADER, RateLimiter
from sync.files.errors import (
    AllSourcesFailedError,
    FileChangedError,
    FileSyncError,
    InsufficientSpaceError,
    PathRefusedError,
    TransferBusyError,
    UnknownCategoryError,
)
from sync.files.manifest import ManifestEntry
from sync.files.manifest_cache import StatKey
from sync.files.slices import FileSlice, parse_range
from sync.files.tombstones import tombstone_etag
from sync.files.wire import (
    BAD_REQUEST,
    BINARY,
    CATEGORY,
    FILE_ERRORS,
    FILE_HASH,
    FILE_PATH,
    MANIFEST_PARAMS,
    MAX_PAGE_LIMIT,
    PREFIX,
    PULL_ERRORS,
    UNKNOWN_CATEGORY,
    BatchBody,
    ManifestPage,
    PullAnswer,
    PullBody,
)
from sync.guards import check_raw_query_value, open_inside, validate_rel_path
from sync.transports.protocol import PeerRef, TransferResult

__all__ = ["PREFIX", "FileHandlers", "PullHandler", "file_routes"]

logger = logging.getLogger(__name__)

DEFAULT_PAGE_LIMIT = 10_000
BATCH_READ_FILES = 64
BATCH_READ_BYTES = 4 << 20
"""Files read in one worker-thread call while serving a batch: at most this many, or bytes."""
BATCH_CONTENT_TYPE = "application/x-shoal-files"
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")

PullHandler = Callable[[str, str, str, PeerRef], Awaitable[TransferResult | None]]
"""pull(category, path, hash, source) -> the transfer, or None when the file was already here."""


def _refusal(status: int, code: str, reason: str, **headers: str) -> web.Response:
    return error_response(status, reason, code, headers=headers)


def _raw_param(request: web.Request, name: str) -> str | None:
    for item in request.rel_url.raw_query_string.split("&"):
        key, sep, value = item.partition("=")
        if sep and key == name:
            return value
    return None


def _path_param(request: web.Request) -> str:
    raw = _raw_param(request, "path")
    if raw is None:
        raise PathRefusedError("", "the path parameter is required")
    check_raw_query_value(raw)
    return validate_rel_path(request.query.get("path", ""))


def _expected_hash(request: web.Request) -> str | None:
    wanted = request.query.get("hash")
    if wanted is None:
        header = request.headers.get("If-Match", "").strip()
        if not header or header == "*":
            return None
        wanted = header.removeprefix("W/").strip('"')
    return wanted.lower()


def file_routes(
    catalog: FileCatalog,
    pull: PullHandler | None = None,
    *,
    upload_limit_bytes_s: float | None = None,
    limiter: RateLimiter | None = None,
    on_served: Callable[[str, int], None] | None = None,
) -> list[web.RouteDef]:
    """The file sync routes over `catalog` as plain aiohttp routes (FileHandlers'); a node
    serves FileHandlers' declarations behind its auth and access rules."""
    if limiter is None and upload_limit_bytes_s:
        limiter = RateLimiter(upload_limit_bytes_s)
    return route_defs(FileHandlers(catalog, pull, limiter, on_served))


PEERS = (Caller.PEER, Caller.OPERATOR)
"""Who reads and pushes files: other nodes, and operators (`shoal sync`)."""


class FileHandlers:
    """The file sync routes over one catalog, each declared on its handler: `pull`
    (SyncCoordinator.pull_file) serves `POST .../pull`, which answers 503 without it;
    `limiter` caps the bytes of files served, all requests together (none: unlimited);
    `on_served(category, n)` is told every n file bytes sent."""

    def __init__(
        self,
        catalog: FileCatalog,
        pull: PullHandler | None,
        limiter: RateLimiter | None = None,
        on_served: Callable[[str, int], None] | None = None,
    ) -> None:
        self._catalog = catalog
        self._pull = pull
        self._limiter = limiter
        self._on_served = on_served

    def category_of(self, request: web.Request) -> str:
        category = request.match_info["category"]
        self._catalog.root(category)
        return category

    @route(
        "GET",
        PREFIX + "/{category}/manifest",
        callers=PEERS,
        answers=(
            (
                200,
                "a page: category, algorithm, piece_size, etag, shared_id, next, entries (and "
                "tombstones)",
            ),
            (304, "unchanged since If-None-Match (first page only)"),
        ),
        errors=[Refusal(400, "bad_request", "bad limit or path"), UNKNOWN_CATEGORY],
        params=MANIFEST_PARAMS,
        answer=ManifestPage,
        head=False,
    )
    async def manifest(self, request: web.Request) -> web.StreamResponse:
        """Paged manifest: {path, size, mtime_ns, hash, pieces} sorted by path; `next` is the
        cursor of the following page; the first page of a category whose deletions propagate
        also lists its tombstones {path, hash, node, deleted_at_ns}"""
        try:
            category = self.category_of(request)
            limit = _limit(request.query.get("limit"))
            if "path" in request.query:
                return await self._one_entry(request, category)
            after = request.query.get("after")
            listing = await self._catalog.listing_for_page(category, after)
        except UnknownCategoryError as exc:
            return _refusal(404, "unknown_category", str(exc))
        except (PathRefusedError, ValueError) as exc:
            return _refusal(400, "bad_request", str(exc))
        tombstones = self._catalog.served_tombstones(category)
        listing_etag = tombstone_etag(listing.etag, tombstones)
        etag = f'"{listing_etag}"'
        if after is None and request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        start, end, following = listing.page(after, limit)
        head: dict[str, Any] = {
            "category": category,
            "algorithm": "sha256",
            "piece_size": self._catalog.piece_size,
            "etag": listing_etag,
            "shared_id": self._catalog.shared_id(category),
            "next": following,
        }
        if after is None and self._catalog.propagates(category):
            head["tombstones"] = [tomb.to_json() for tomb in tombstones]
        text = json.dumps(head, separators=(",", ":"))[:-1]
        text += ',"entries":[' + ",".join(listing.texts[start:end]) + "]}"
        return web.Response(text=text, content_type="application/json", headers={"ETag": etag})

    async def _one_entry(self, request: web.Request, category: str) -> web.Response:
        path = _path_param(request)
        entries: list[dict[str, Any]] = []
        try:
            fd, _ = await asyncio.to_thread(open_inside, self._catalog.root(category), path)
        except (FileNotFoundError, NotADirectoryError):
            fd = -1
        except OSError as exc:
            raise PathRefusedError(path, exc.strerror or str(exc)) from exc
        if fd >= 0:
            try:
                entry = await self._catalog.cache(category).entry_for_open_file(path, fd)
            finally:
                os.close(fd)
            if entry is not None:
                entries.append(entry.to_json())
        body = {
            "category": category,
            "algorithm": "sha256",
            "piece_size": self._catalog.piece_size,
            "etag": "",
            "shared_id": self._catalog.shared_id(category),
            "next": None,
            "entries": entries,
        }
        return web.json_response(body)

    @route(
        "GET",
        PREFIX + "/{category}/file",
        callers=PEERS,
        answers=((200, "the whole file"), (206, "the requested range")),
        errors=FILE_ERRORS,
        params=(CATEGORY, FILE_PATH, FILE_HASH),
        answer=BINARY,
        answer_type="application/octet-stream",
        head=False,
    )
    async def file(self, request: web.Request) -> web.StreamResponse:
        """The bytes of one file (Range supported); X-Shoal-Content-Hash and ETag carry its
        hash; hash=H or If-Match names the version wanted"""
        try:
            category = self.category_of(request)
            path = _path_param(request)
            fd, _ = await asyncio.to_thread(open_inside, self._catalog.root(category), path)
        except UnknownCategoryError as exc:
            return _refusal(404, "unknown_category", str(exc))
        except PathRefusedError as exc:
            return _refusal(400, "bad_path", str(exc))
        except (FileNotFoundError, NotADirectoryError):
            return _refusal(404, "not_found", "no such file")
        except OSError as exc:
            return _refusal(400, "bad_path", f"cannot open: {exc.strerror or exc}")
        try:
            return await self._file_answer(request, category, path, fd)
        except FileSyncError as exc:
            os.close(fd)
            return _refusal(503, "unavailable", str(exc))
        except BaseException:
            os.close(fd)
            raise

    async def _file_answer(
        self, request: web.Request, category: str, path: str, fd: int
    ) -> web.StreamResponse:
        entry = await self._catalog.cache(category).entry_for_open_file(path, fd)
        if entry is None:
            os.close(fd)
            return _refusal(409, "changing", "the file is being written", **{"Retry-After": "1"})
        expected = _expected_hash(request)
        hashes = {HASH_HEADER: entry.hash, "ETag": f'"{entry.hash}"'}
        if expected is not None and expected != entry.hash:
            os.close(fd)
            return _refusal(412, "changed", "the file no longer has that hash", **hashes)
        try:
            span = parse_range(request.headers.get("Range"), entry.size)
        except ValueError as exc:
            os.close(fd)
            headers = {"Content-Range": f"bytes */{entry.size}"}
            return _refusal(416, "bad_range", str(exc), **headers)
        headers = {**hashes, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        sent = None if self._on_served is None else functools.partial(self._on_served, category)
        if span is None:
            return FileSlice(fd, 0, entry.size, 200, headers, self._limiter, sent)
        start, end = span
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
        return FileSlice(fd, start, end - start, 206, headers, self._limiter, sent)

    @route(
        "POST",
        PREFIX + "/{category}/files",
        callers=PEERS,
        answers=((200, "the framed stream"),),
        errors=[BAD_REQUEST, UNKNOWN_CATEGORY],
        params=(CATEGORY,),
        body=BatchBody,
        answer=BINARY,
        answer_type=BATCH_CONTENT_TYPE,
    )
    async def files(self, request: web.Request) -> web.StreamResponse:
        """Many small files in one answer: body {"files": [{"path", "hash"}]} (1..2000); the
        answer (application/x-shoal-files) is one frame per file in that order: 4-byte
        big-endian length, a JSON header {"path", "size", "hash"} then size bytes, or {"path",
        "error", "status", "reason"} (404 missing, 409 not hashed yet, 412 another hash now,
        413 too large) without bytes"""
        try:
            category = self.category_of(request)
            wanted = _batch_body(await request.json())
        except UnknownCategoryError as exc:
            return _refusal(404, "unknown_category", str(exc))
        except (PathRefusedError, ValueError) as exc:
            return _refusal(400, "bad_request", str(exc))
        root = self._catalog.root(category)
        cache = self._catalog.cache(category)
        response = web.StreamResponse(
            headers={"Content-Type": BATCH_CONTENT_TYPE, "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        group: list[tuple[str, str, tuple[ManifestEntry, StatKey] | None]] = []
        group_bytes = 0
        for index, (path, digest) in enumerate(wanted):
            cached = cache.lookup_keyed(path)
            group.append((path, digest, cached))
            group_bytes += cached[0].size if cached is not None else 0
            last = index == len(wanted) - 1
            if last or len(group) >= BATCH_READ_FILES or group_bytes >= BATCH_READ_BYTES:
                frames = await asyncio.to_thread(_read_group, root, group)
                group, group_bytes = [], 0
                if self._limiter is not None:
                    await self._limiter.take(len(frames))
                await response.write(frames)
                if self._on_served is not None:
                    self._on_served(category, len(frames))
        await response.write_eof()
        return response

    @route(
        "POST",
        PREFIX + "/{category}/pull",
        callers=PEERS,
        answers=((200, '{"installed": bool, "result": transfer or null}'),),
        errors=PULL_ERRORS,
        params=(CATEGORY,),
        body=PullBody,
        answer=PullAnswer,
    )
    async def pull_request(self, request: web.Request) -> web.Response:
        """Pull a file from the given peer now (how a node pushes); answered once installed.
        The peer must be a member of this node's view, at its own address"""
        if self._pull is None:
            return _refusal(503, "unavailable", "this node does not take pull requests")
        try:
            category = self.category_of(request)
            body = PullBody.model_validate_json(await request.read())
            path = validate_rel_path(body.path)
            source = PeerRef.from_json(body.peer.model_dump())
            content_hash = body.hash
        except UnknownCategoryError as exc:
            return _refusal(404, "unknown_category", str(exc))
        except ValidationError as exc:
            return _refusal(400, "bad_request", f"pull body: {_first_error(exc)}")
        except ValueError as exc:
            return _refusal(400, "bad_request", str(exc))
        try:
            result = await self._pull(category, path, content_hash, source)
        except (FileChangedError, TransferBusyError) as exc:
            return _refusal(409, "conflict", str(exc))
        except AllSourcesFailedError as exc:
            status = 409 if exc.only_changed else 502
            return _refusal(status, "source_failed", str(exc))
        except InsufficientSpaceError as exc:
            return error_response(
                507,
                str(exc),
                "insufficient_storage",
                path=exc.directory,
                free_bytes=exc.free_bytes,
            )
        except PathRefusedError as exc:
            return _refusal(400, "bad_path", str(exc))
        except FileSyncError as exc:
            return _refusal(502, "source_failed", str(exc))
        answer = {"installed": result is not None, "result": result.to_json() if result else None}
        return web.json_response(answer)


def _first_error(exc: ValidationError) -> str:
    """`field.sub: message` of a pydantic error, e.g. `hash: String should match pattern ...`."""
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "body"
    return f"{where}: {error['msg']}"


def _read_group(
    root: Path, group: list[tuple[str, str, tuple[ManifestEntry, StatKey] | None]]
) -> bytes:
    return b"".join(read_served_file(root, path, digest, cached) for path, digest, cached in group)


def _batch_body(data: Any) -> list[tuple[str, str]]:
    """The (path, hash) pairs of a batch request body `{"files": [{"path", "hash"}]}`."""
    if isinstance(data, dict) and set(data) - {"files"}:
        unknown = ", ".join(sorted(str(key) for key in set(data) - {"files"}))
        raise ValueError(f'unknown field(s) {unknown}; the body is {{"files": [...]}}')
    items = data.get("files") if isinstance(data, dict) else None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_FILES:
        raise ValueError(f'body must be {{"files": [...]}} with 1..{MAX_BATCH_FILES} files')
    wanted: list[tuple[str, str]] = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("each file must be an object with path and hash")
        path = validate_rel_path(item.get("path"))  # type: ignore[arg-type]
        digest = item.get("hash")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise ValueError(f"{path}: hash must be 64 lowercase hex digits")
        wanted.append((path, digest))
    return wanted


def _limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_PAGE_LIMIT
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE_LIMIT:
        raise ValueError(f"limit must be an integer 1..{MAX_PAGE_LIMIT}")
    return int(text)
