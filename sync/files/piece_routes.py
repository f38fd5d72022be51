"""HTTP routes of fan-out: which verified pieces of a file version this node holds
(`GET .../pieces`), complete or still downloading, and one such piece (`GET .../piece`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import re

from aiohttp import web

from config import error_response
from config.declare import Caller, Refusal, route, route_defs
from sync.errors import SyncError
from sync.files.catalog import FileCatalog
from sync.files.download import HASH_HEADER, RateLimiter
from sync.files.errors import FileSyncError, PathRefusedError, UnknownCategoryError
from sync.files.manifest import ManifestEntry
from sync.files.pieces import PieceBook, PieceMap
from sync.files.routes import _path_param
from sync.files.slices import FileSlice
from sync.files.wire import BINARY, CATEGORY, CONTENT_HASH, FILE_PATH, PREFIX, PieceMapAnswer
from sync.guards import open_inside

__all__ = ["PIECE_HEADER", "PieceHandlers", "piece_routes"]

PIECE_HEADER = "X-Shoal-Piece-Hash"
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


class _Refused(SyncError):
    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code


def _hash_param(request: web.Request) -> str:
    wanted = request.query.get("hash", "")
    if not _HEX64.match(wanted):
        raise _Refused(400, "bad_request", "hash must be 64 lowercase hex digits (sha256)")
    return wanted


def piece_routes(
    catalog: FileCatalog, book: PieceBook, limiter: RateLimiter | None = None
) -> list[web.RouteDef]:
    """The piece routes over `catalog` and the downloads in `book`: only pieces verified
    against the manifest are ever announced or served. `limiter` is the node's upload cap
    (shared with the file routes). Mount behind the node's auth middleware."""
    return route_defs(PieceHandlers(catalog, book, limiter))


PIECE_ERRORS = (
    Refusal(400, "bad_path", "path, hash or index refused"),
    Refusal(404, "not_held", "unknown category, or no verified piece of that version here"),
)
INDEX = (
    "index",
    "query",
    "Piece number, from 0",
    {"type": "integer", "minimum": 0, "x-required": True},
)


class PieceHandlers:
    """The piece routes, each declared on its handler, over `catalog` and the downloads in
    `book`: only pieces verified against the manifest are ever announced or served."""

    def __init__(self, catalog: FileCatalog, book: PieceBook, limiter: RateLimiter | None) -> None:
        self._catalog = catalog
        self._book = book
        self._limiter = limiter

    async def held(self, request: web.Request) -> tuple[str, ManifestEntry, set[int], int]:
        """(category, entry, verified pieces, fd of the complete file or -1)."""
        try:
            category = request.match_info["category"]
            root = self._catalog.root(category)
            path = _path_param(request)
        except UnknownCategoryError as exc:
            raise _Refused(404, "unknown_category", str(exc)) from None
        except (PathRefusedError, ValueError) as exc:
            raise _Refused(400, "bad_path", str(exc)) from None
        wanted = _hash_param(request)
        try:
            fd, _ = await asyncio.to_thread(open_inside, root, path)
        except (FileNotFoundError, NotADirectoryError, PathRefusedError):
            fd = -1
        except OSError as exc:
            raise _Refused(400, "bad_path", f"cannot open: {exc.strerror or exc}") from None
        if fd >= 0:
            try:
                entry = await self._catalog.cache(category).entry_for_open_file(path, fd)
            except BaseException:
                os.close(fd)
                raise
            if entry is not None and entry.hash == wanted:
                return category, entry, set(range(entry.piece_count)), fd
            os.close(fd)
        holding = self._book.holding(category, path, wanted)
        if holding is None or not (holding.have or holding.pending):
            reason = f"no piece of {path} at hash {wanted[:16]} here or on its way"
            raise _Refused(404, "not_held", reason)
        return category, holding.entry, set(holding.have), -1

    @route(
        "GET",
        PREFIX + "/{category}/pieces",
        callers=[Caller.PEER, Caller.OPERATOR],
        answers=((200, "the piece map"),),
        errors=PIECE_ERRORS,
        params=(CATEGORY, FILE_PATH, CONTENT_HASH),
        answer=PieceMapAnswer,
        head=False,
    )
    async def pieces(self, request: web.Request) -> web.Response:
        """The verified pieces of one file version this node can serve, complete or still
        downloading: `have` and `pending` are hex bitfields (piece 0 is the high bit of the
        first byte), `uploads` the pieces it is serving now"""
        try:
            category, entry, have, fd = await self.held(request)
        except _Refused as exc:
            return error_response(exc.status, str(exc), exc.code)
        except FileSyncError as exc:
            return error_response(503, str(exc), "unavailable")
        if fd >= 0:
            os.close(fd)
        holding = self._book.holding(category, entry.path, entry.hash)
        pending = frozenset(holding.pending) if holding is not None and fd < 0 else frozenset()
        answer = PieceMap(
            entry.path,
            entry.hash,
            entry.size,
            entry.piece_size,
            frozenset(have),
            pending - have,
            self._book.uploads,
        )
        return web.json_response(answer.to_json(), headers={"Cache-Control": "no-store"})

    @route(
        "GET",
        PREFIX + "/{category}/piece",
        callers=[Caller.PEER, Caller.OPERATOR],
        answers=((200, "the piece's bytes"),),
        errors=[*PIECE_ERRORS, Refusal(416, "bad_range", "index past the file's last piece")],
        params=(CATEGORY, FILE_PATH, CONTENT_HASH, INDEX),
        answer=BINARY,
        answer_type="application/octet-stream",
        head=False,
    )
    async def piece(self, request: web.Request) -> web.StreamResponse:
        """One verified piece of a file version (X-Shoal-Piece-Hash names its sha256), from the
        complete file or the partial one being downloaded; served under the node's upload
        cap"""
        try:
            category, entry, have, fd = await self.held(request)
            try:
                index = _index_param(request, entry)
                if index not in have:
                    reason = f"piece {index} of {entry.path} is not held yet"
                    raise _Refused(404, "not_held", reason)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                raise
            if fd < 0:
                fd = await asyncio.to_thread(
                    _open_partial, self._book, category, entry, self._catalog
                )
        except _Refused as exc:
            return error_response(exc.status, str(exc), exc.code)
        except FileSyncError as exc:
            return error_response(503, str(exc), "unavailable")
        offset, length = entry.piece_span(index)
        headers = {
            HASH_HEADER: entry.hash,
            PIECE_HEADER: entry.piece_hashes()[index],
            "Content-Type": "application/octet-stream",
            "Cache-Control": "no-store",
        }
        counted = functools.partial(self._book.count_served, category)
        self._book.uploads += 1
        try:
            response = FileSlice(fd, offset, length, 200, headers, self._limiter, counted)
            await response.prepare(request)
        finally:
            self._book.uploads -= 1
        return response


def _index_param(request: web.Request, entry: ManifestEntry) -> int:
    text = request.query.get("index", "")
    if not text.isdigit() or len(text) > 12:
        raise _Refused(400, "bad_request", "index must be a piece number 0, 1, ...")
    index = int(text)
    if index >= entry.piece_count:
        reason = f"piece {index} outside {entry.path}, which has {entry.piece_count} pieces"
        raise _Refused(416, "bad_range", reason)
    return index


def _open_partial(
    book: PieceBook, category: str, entry: ManifestEntry, catalog: FileCatalog
) -> int:
    """A read-only descriptor of the file being downloaded, or of the complete file when the
    download was installed meanwhile (same bytes: the same hash). Blocking."""
    holding = book.holding(category, entry.path, entry.hash)
    if holding is not None:
        try:
            return os.open(holding.partial_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            pass
    try:
        fd, _ = open_inside(catalog.root(category), entry.path)
    except OSError as exc:
        raise _Refused(404, "not_held", f"{entry.path} is gone: {exc.strerror or exc}") from None
    size = os.fstat(fd).st_size
    if size != entry.size:
        os.close(fd)
        raise _Refused(404, "not_held", f"{entry.path} changed while being served")
    return fd
