"""OpenAPI notes of the file sync routes, as keyword arguments of node's RouteDoc, and the model
the pull route validates its body with (the document's schema is generated from it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PREFIX = "/v1/sync"
HEX64 = r"^[0-9a-f]{64}$"
_COMPONENT = r"[^./\u0000-\u001f\u007f][^/\u0000-\u001f\u007f]{0,254}"
REL_PATH = f"^{_COMPONENT}(/{_COMPONENT})*$"
"""A relative path validate_rel_path accepts (components not starting with a dot, so no `.`,
`..` or internal `.shoal-` names; no control characters)."""
SAFE_NAME = r"^[^./%\\\u0000-\u001f\u007f][^/%\\\u0000-\u001f\u007f]{0,254}$"
"""One path component validate_rel_path and check_raw_query_value accept, whatever a
client's URL encoding does to it (`/` is sent as %2F in a query value, which is refused)."""
MAX_PAGE_LIMIT = 50_000


class PullPeer(BaseModel):
    """The peer to pull from: a member of the receiving node's view, at its own address."""

    model_config = ConfigDict(strict=True, extra="forbid")

    node_id: str = Field(min_length=1)
    url: str = Field(
        pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$",
        description="http(s)://HOST:PORT",
    )
    transports: list[str] = Field(default=["http"])


class PullBody(BaseModel):
    """Body of `POST /v1/sync/{category}/pull`: pull `path` at version `hash` from `peer`."""

    model_config = ConfigDict(strict=True, extra="forbid")

    peer: PullPeer
    path: str = Field(
        pattern=REL_PATH, max_length=4096, description="relative to the category dir (a/b.bin)"
    )
    hash: str = Field(pattern=HEX64, description="sha256 hex of the version wanted")


_ENTRY = {
    "type": "object",
    "required": ["path", "size", "mtime_ns", "hash", "pieces"],
    "properties": {
        "path": {"type": "string"},
        "size": {"type": "integer", "minimum": 0},
        "mtime_ns": {"type": "integer"},
        "hash": {"type": "string", "pattern": HEX64},
        "pieces": {"type": "array", "items": {"type": "string"}},
    },
}
_TOMBSTONE = {
    "type": "object",
    "required": ["path", "hash", "node", "deleted_at_ns"],
    "properties": {
        "path": {"type": "string"},
        "hash": {"type": "string", "pattern": HEX64},
        "node": {"type": "string", "description": "the node the file was deleted on"},
        "deleted_at_ns": {"type": "integer", "description": "when (Unix time, nanoseconds)"},
    },
}
MANIFEST_PAGE = {
    "type": "object",
    "required": ["category", "algorithm", "piece_size", "etag", "shared_id", "next", "entries"],
    "properties": {
        "category": {"type": "string"},
        "algorithm": {"const": "sha256"},
        "piece_size": {"type": "integer"},
        "etag": {"type": "string"},
        "shared_id": {"type": ["string", "null"]},
        "next": {"type": ["string", "null"]},
        "entries": {"type": "array", "items": _ENTRY},
        "tombstones": {
            "type": "array",
            "items": _TOMBSTONE,
            "description": "first page of a category whose deletions propagate: files deleted "
            "within tombstone_ttl_s (a copy of that hash, no newer than the deletion, is "
            "deleted by a puller)",
        },
    },
}
PULL_ANSWER = {
    "type": "object",
    "required": ["installed", "result"],
    "properties": {
        "installed": {"type": "boolean"},
        "result": {
            "type": ["object", "null"],
            "properties": {
                "peer": {"type": "string"},
                "transport": {"type": "string"},
                "bytes_transferred": {"type": "integer"},
            },
        },
    },
}


def file_route_docs(categories: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One dict per route: method, path, summary, responses, parameters, body, response
    (RouteDoc fields); `categories` (when given) are the category names a path may hold."""
    names: dict[str, Any] = {"type": "string"}
    if categories:
        names["enum"] = list(categories)
    category = ("category", "path", "File category: models, training or configs", names)
    path = (
        "path",
        "query",
        "File path relative to the category directory (a/b.bin)",
        {"type": "string", "pattern": SAFE_NAME, "x-required": True},
    )
    return [
        _manifest_doc(category),
        _file_doc(category, path),
        _batch_doc(category),
        _pull_doc(category),
    ]


def _manifest_doc(category: tuple[Any, ...]) -> dict[str, Any]:
    """The RouteDoc fields of `GET /v1/sync/{category}/manifest`."""
    return {
        "method": "GET",
        "path": PREFIX + "/{category}/manifest",
        "summary": "Paged manifest: {path, size, mtime_ns, hash, pieces} sorted by path; "
        "`next` is the cursor of the following page; the first page of a category whose "
        "deletions propagate also lists its tombstones {path, hash, node, deleted_at_ns}",
        "responses": (
            (
                200,
                "a page: category, algorithm, piece_size, etag, shared_id, next, entries "
                "(and tombstones)",
            ),
            (304, "unchanged since If-None-Match (first page only)"),
            (400, "bad limit or path"),
            (404, "unknown category"),
        ),
        "parameters": (
            category,
            ("after", "query", "Cursor: list paths after this one"),
            (
                "limit",
                "query",
                f"Entries per page, 1..{MAX_PAGE_LIMIT} (default 10000)",
                {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LIMIT},
            ),
            (
                "path",
                "query",
                "Only the entry of this file (hashed now if stale)",
                {"type": "string", "pattern": SAFE_NAME},
            ),
        ),
        "response": MANIFEST_PAGE,
    }


def _file_doc(category: tuple[Any, ...], path: tuple[Any, ...]) -> dict[str, Any]:
    """The RouteDoc fields of `GET /v1/sync/{category}/file`."""
    return {
        "method": "GET",
        "path": PREFIX + "/{category}/file",
        "summary": "The bytes of one file (Range supported); X-Shoal-Content-Hash and ETag "
        "carry its hash; hash=H or If-Match names the version wanted",
        "responses": (
            (200, "the whole file"),
            (206, "the requested range"),
            (400, "path refused (absolute, .., encoded separator, NUL, escaping symlink)"),
            (404, "no such file or category"),
            (409, "the file is being written; see Retry-After"),
            (412, "the file no longer has the wanted hash"),
            (416, "unsatisfiable or multiple ranges"),
        ),
        "parameters": (
            category,
            path,
            ("hash", "query", "Expected content hash (sha256 hex)", {"type": "string"}),
        ),
        "response": {"type": "string", "format": "binary"},
        "response_type": "application/octet-stream",
    }


def _batch_doc(category: tuple[Any, ...]) -> dict[str, Any]:
    """The RouteDoc fields of `POST /v1/sync/{category}/files`."""
    return {
        "method": "POST",
        "path": PREFIX + "/{category}/files",
        "summary": "Many small files in one answer: body "
        '{"files": [{"path", "hash"}]} (1..2000); the answer (application/x-shoal-files) '
        "is one frame per file in that order: 4-byte big-endian length, a JSON header "
        '{"path", "size", "hash"} then size bytes, or {"path", "error", "status", "reason"} '
        "(404 missing, 409 not hashed yet, 412 another hash now, 413 too large) without bytes",
        "responses": (
            (200, "the framed stream"),
            (400, "malformed body or path"),
            (404, "unknown category"),
        ),
        "parameters": (category,),
        "response": {"type": "string", "format": "binary"},
        "response_type": "application/x-shoal-files",
        "body": {
            "type": "object",
            "additionalProperties": False,
            "required": ["files"],
            "properties": {
                "files": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2000,
                    "items": {
                        "type": "object",
                        "required": ["path", "hash"],
                        "properties": {
                            "path": {"type": "string", "minLength": 1},
                            "hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                        },
                    },
                }
            },
        },
    }


def _pull_doc(category: tuple[Any, ...]) -> dict[str, Any]:
    """The RouteDoc fields of `POST /v1/sync/{category}/pull`."""
    return {
        "method": "POST",
        "path": PREFIX + "/{category}/pull",
        "summary": "Pull a file from the given peer now (how a node pushes); answered once "
        "installed. The peer must be a member of this node's view, at its own address",
        "responses": (
            (200, '{"installed": bool, "result": transfer or null}'),
            (400, "malformed body or path"),
            (403, "the peer is not a member of this node's view, or not at that URL"),
            (404, "unknown category"),
            (
                409,
                "the source no longer has that version, a transfer is in progress, or the "
                "X-Shoal-Fence header names another plan than this node's (stale_fence)",
            ),
            (502, "the source failed"),
            (503, "this node does not take pull requests"),
            (507, "not enough free space"),
        ),
        "parameters": (category,),
        "body": PullBody,
        "response": PULL_ANSWER,
    }
