"""The file sync routes' paths, parameters, the model the pull route validates its body with,
and the models of their answers (the OpenAPI document's schemas are generated from them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from config.declare import Refusal, unset
from sync.files.catalog import CHECKPOINTS, FILE_CATEGORIES

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


CATEGORY = (
    "category",
    "path",
    "File category: models, training, configs, or checkpoints (served to peers that copy or "
    "restore a committed step; never synced by category)",
    {"type": "string", "enum": [*FILE_CATEGORIES, CHECKPOINTS]},
)
FILE_PATH = (
    "path",
    "query",
    "File path relative to the category directory (a/b.bin)",
    {"type": "string", "pattern": SAFE_NAME, "x-required": True},
)
CONTENT_HASH = (
    "hash",
    "query",
    "The file version (sha256 hex content hash of the manifest)",
    {"type": "string", "pattern": HEX64, "x-required": True},
)
FILE_HASH = ("hash", "query", "Expected content hash (sha256 hex)", {"type": "string"})
MANIFEST_PARAMS = (
    CATEGORY,
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
)
BINARY = {"type": "string", "format": "binary"}
UNKNOWN_CATEGORY = Refusal(404, "unknown_category", "unknown category")
BAD_REQUEST = Refusal(400, "bad_request", "malformed body or path")
FILE_ERRORS = (
    Refusal(
        400, "bad_path", "path refused (absolute, .., encoded separator, NUL, escaping symlink)"
    ),
    Refusal(404, "not_found", "no such file or category"),
    Refusal(409, "changing", "the file is being written; see Retry-After"),
    Refusal(412, "changed", "the file no longer has the wanted hash"),
    Refusal(416, "bad_range", "unsatisfiable or multiple ranges"),
)
PULL_ERRORS = (
    BAD_REQUEST,
    Refusal(403, "forbidden", "the peer is not a member of this node's view, or not at that URL"),
    UNKNOWN_CATEGORY,
    Refusal(
        409,
        "conflict",
        "the source no longer has that version, a transfer is in progress, or the X-Shoal-Fence"
        " header names another plan than this node's (stale_fence)",
    ),
    Refusal(502, "source_failed", "the source failed"),
    Refusal(503, "unavailable", "this node does not take pull requests"),
    Refusal(507, "insufficient_storage", "not enough free space"),
)
Hex = Annotated[str, Field(pattern=HEX64)]


class Entry(BaseModel):
    """One file of a manifest page."""

    path: str
    size: int = Field(ge=0)
    mtime_ns: int
    hash: Hex
    pieces: list[str]


class Tombstone(BaseModel):
    """A file deleted within tombstone_ttl_s."""

    path: str
    hash: Hex
    node: str = Field(description="the node the file was deleted on")
    deleted_at_ns: int = Field(description="when (Unix time, nanoseconds)")


class ManifestPage(BaseModel):
    """A page of a category's manifest, sorted by path."""

    category: str
    algorithm: Literal["sha256"]
    piece_size: int
    etag: str
    shared_id: str | None
    next: str | None
    entries: list[Entry]
    tombstones: list[Tombstone] | SkipJsonSchema[None] = unset(
        "first page of a category whose deletions propagate: files deleted within "
        "tombstone_ttl_s (a copy of that hash, no newer than the deletion, is deleted by a "
        "puller)"
    )


class Transfer(BaseModel):
    """What a pull transferred."""

    peer: str | None = None
    transport: str | None = None
    bytes_transferred: int | None = None


class PullAnswer(BaseModel):
    """The answer of a pull request: whether a file was installed, and its transfer."""

    installed: bool
    result: Transfer | None


class WantedFile(BaseModel):
    """A file of a batch: its path and the version wanted."""

    path: str = Field(min_length=1)
    hash: Hex


class BatchBody(BaseModel):
    """Body of `POST /v1/sync/{category}/files` (checked by the handler the same way)."""

    model_config = ConfigDict(extra="forbid")

    files: list[WantedFile] = Field(min_length=1, max_length=2000)


class PieceMapAnswer(BaseModel):
    """The verified pieces of one file version a node can serve (sync.files.pieces.PieceMap)."""

    path: str
    hash: Hex
    size: int = Field(ge=0)
    piece_size: int
    piece_count: int = Field(ge=1)
    complete: bool
    have: str = Field(pattern="^([0-9a-f]{2})*$")
    pending: Annotated[str, Field(pattern="^([0-9a-f]{2})*$")] | SkipJsonSchema[None] = unset()
    uploads: Annotated[int, Field(ge=0)] | SkipJsonSchema[None] = unset()
