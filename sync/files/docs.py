"""OpenAPI notes of the file sync routes, as keyword arguments of node's RouteDoc."""

from __future__ import annotations

from typing import Any

PREFIX = "/v1/sync"


def file_route_docs() -> list[dict[str, Any]]:
    """One dict per route: method, path, summary, responses, parameters (RouteDoc fields)."""
    category = ("category", "path", "File category: models, training or configs")
    path = ("path", "query", "File path relative to the category directory (a/b.bin)")
    return [
        {
            "method": "GET",
            "path": PREFIX + "/{category}/manifest",
            "summary": "Paged manifest: {path, size, mtime_ns, hash, pieces} sorted by path; "
            "`next` is the cursor of the following page",
            "responses": (
                (200, "a page: category, algorithm, piece_size, etag, shared_id, next, entries"),
                (304, "unchanged since If-None-Match (first page only)"),
                (400, "bad limit or path"),
                (404, "unknown category"),
            ),
            "parameters": (
                category,
                ("after", "query", "Cursor: list paths after this one"),
                ("limit", "query", "Entries per page, 1..50000 (default 10000)"),
                ("path", "query", "Only the entry of this file (hashed now if stale)"),
            ),
        },
        {
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
                ("hash", "query", "Expected content hash (sha256 hex)"),
            ),
        },
        {
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
        },
        {
            "method": "POST",
            "path": PREFIX + "/{category}/pull",
            "summary": "Pull a file from the given peer now (how a node pushes): body "
            '{"peer": {"node_id", "url"}, "path", "hash"}; answered once installed',
            "responses": (
                (200, '{"installed": bool, "result": transfer or null}'),
                (400, "malformed body or path"),
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
        },
    ]
