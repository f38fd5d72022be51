"""Manifest entries and their content hashes: sha256 per piece, and the file hash built from them.

A file of one piece (size <= piece_size) has hash = sha256(content), as `sha256sum` prints it;
a larger file has hash = sha256(concatenated raw piece digests) and lists its piece hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from sync.errors import ManifestError, PathRefusedError
from sync.guards import validate_rel_path

HASH_ALGORITHM: Final = "sha256"
DEFAULT_PIECE_SIZE: Final = 16 << 20
MIN_PIECE_SIZE: Final = 4 << 10
MAX_PIECE_SIZE: Final = 64 << 20
READ_CHUNK_BYTES: Final = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def check_piece_size(piece_size: int) -> int:
    """`piece_size` if it is within MIN_PIECE_SIZE..MAX_PIECE_SIZE; else ValueError."""
    if isinstance(piece_size, bool) or not MIN_PIECE_SIZE <= piece_size <= MAX_PIECE_SIZE:
        raise ValueError(
            f"piece_size must be {MIN_PIECE_SIZE}..{MAX_PIECE_SIZE} bytes, got {piece_size!r}"
        )
    return piece_size


def piece_count(size: int, piece_size: int) -> int:
    """Number of pieces of a file of `size` bytes (an empty file is one empty piece)."""
    return max(1, -(-size // piece_size))


def content_hash(piece_digests: Sequence[bytes]) -> str:
    """The file hash from its raw piece digests (see the module docstring)."""
    if len(piece_digests) == 1:
        return piece_digests[0].hex()
    return hashlib.sha256(b"".join(piece_digests)).hexdigest()


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One file of a category: relative path, size, mtime, content hash and piece hashes.

    `pieces` is empty for a file of a single piece (its piece hash is `hash`).
    """

    path: str
    size: int
    mtime_ns: int
    hash: str
    pieces: tuple[str, ...] = ()
    piece_size: int = field(default=DEFAULT_PIECE_SIZE, compare=False)

    @property
    def piece_count(self) -> int:
        return piece_count(self.size, self.piece_size)

    def piece_hashes(self) -> tuple[str, ...]:
        """The hash of every piece, in order."""
        return self.pieces if self.pieces else (self.hash,)

    def piece_span(self, index: int) -> tuple[int, int]:
        """(offset, length) of piece `index`."""
        start = index * self.piece_size
        return start, max(0, min(self.piece_size, self.size - start))

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "hash": self.hash,
            "pieces": list(self.pieces),
        }

    def json_text(self) -> str:
        """to_json() encoded compactly (pages are built from these; orjson writes what
        json.dumps(separators=(",", ":"), ensure_ascii=False) does, four times faster)."""
        return orjson.dumps(self.to_json()).decode()


@dataclass(frozen=True)
class ManifestPage:
    """One page of a category's manifest, sorted by path; `next` is the cursor of the next page.

    `etag` names the listing the page was cut from; `shared_id` identifies the shared storage
    (NFS export and marker) the category lives on, None when it is not shared.
    """

    category: str
    piece_size: int
    entries: tuple[ManifestEntry, ...]
    next: str | None
    etag: str = ""
    shared_id: str | None = None
    algorithm: str = HASH_ALGORITHM


def hash_fd(
    fd: int, piece_size: int, start: int = 0, length: int | None = None
) -> tuple[int, list[bytes]]:
    """Hash bytes of `fd` from `start` (to EOF, or `length` bytes) piece by piece.

    Returns (bytes read, raw piece digests); reads with pread, so the file offset is untouched.
    Blocking and GIL-releasing; run it in a thread.
    """
    buffer = bytearray(min(READ_CHUNK_BYTES, piece_size))
    view = memoryview(buffer)
    digests: list[bytes] = []
    piece = hashlib.sha256()
    in_piece = 0
    done = 0
    while length is None or done < length:
        want = min(len(buffer), piece_size - in_piece)
        if length is not None:
            want = min(want, length - done)
        got = os.preadv(fd, [view[:want]], start + done)
        if got == 0:
            break
        piece.update(view[:got])
        in_piece += got
        done += got
        if in_piece == piece_size:
            digests.append(piece.digest())
            piece = hashlib.sha256()
            in_piece = 0
    if in_piece or not digests:
        digests.append(piece.digest())
    return done, digests


def hash_file(path: str | os.PathLike[str], piece_size: int) -> tuple[int, str, tuple[str, ...]]:
    """(size, hash, piece hashes) of a file, as a manifest entry holds them. Blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return digest_of_fd(fd, piece_size)
    finally:
        os.close(fd)


def digest_of_fd(fd: int, piece_size: int) -> tuple[int, str, tuple[str, ...]]:
    """(size, hash, piece hashes) of the whole content of an open file. Blocking."""
    size, digests = hash_fd(fd, piece_size)
    pieces = tuple(d.hex() for d in digests) if len(digests) > 1 else ()
    return size, content_hash(digests), pieces


def _int_field(data: Mapping[str, Any], name: str, minimum: int | None = 0) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"entry field {name!r} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ManifestError(f"entry field {name!r} must be >= {minimum}, got {value}")
    return value


def parse_entry(data: Any, piece_size: int) -> ManifestEntry:
    """A ManifestEntry from its JSON form, checked: path, numbers, hashes and piece count,
    and that the piece hashes add up to the file hash. ManifestError otherwise."""
    if not isinstance(data, Mapping):
        raise ManifestError(f"entry must be an object, got {type(data).__name__}")
    path = data.get("path")
    try:
        validate_rel_path(path)  # type: ignore[arg-type]
    except PathRefusedError as exc:
        raise ManifestError(f"entry path refused: {exc}") from exc
    assert isinstance(path, str)
    size = _int_field(data, "size")
    mtime_ns = _int_field(data, "mtime_ns", None)
    digest = data.get("hash")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise ManifestError(f"{path}: hash must be 64 lowercase hex digits")
    raw_pieces = data.get("pieces", [])
    if not isinstance(raw_pieces, list):
        raise ManifestError(f"{path}: pieces must be a list")
    count = piece_count(size, piece_size)
    if count == 1:
        if raw_pieces not in ([], [digest]):
            raise ManifestError(f"{path}: a single-piece file lists other piece hashes")
        return ManifestEntry(path, size, mtime_ns, digest, (), piece_size)
    if len(raw_pieces) != count:
        raise ManifestError(f"{path}: {len(raw_pieces)} piece hashes for {count} pieces")
    for piece in raw_pieces:
        if not isinstance(piece, str) or not _HEX64.match(piece):
            raise ManifestError(f"{path}: piece hashes must be 64 lowercase hex digits")
    pieces = tuple(raw_pieces)
    if content_hash([bytes.fromhex(p) for p in pieces]) != digest:
        raise ManifestError(f"{path}: piece hashes do not add up to the file hash")
    return ManifestEntry(path, size, mtime_ns, digest, pieces, piece_size)


def page_text(page: ManifestPage, entry_texts: Iterable[str]) -> str:
    """The JSON text of a page whose entries are already encoded (ManifestEntry.json_text)."""
    head = {
        "category": page.category,
        "algorithm": page.algorithm,
        "piece_size": page.piece_size,
        "etag": page.etag,
        "shared_id": page.shared_id,
        "next": page.next,
    }
    return _ENCODER.encode(head)[:-1] + ',"entries":[' + ",".join(entry_texts) + "]}"


def parse_page(data: Any, expected_piece_size: int | None = None) -> ManifestPage:
    """A ManifestPage from its JSON form; ManifestError when malformed, of another hash
    algorithm, or (with `expected_piece_size`) cut into pieces of another size."""
    if not isinstance(data, Mapping):
        raise ManifestError("manifest page must be a JSON object")
    algorithm = data.get("algorithm")
    if algorithm != HASH_ALGORITHM:
        raise ManifestError(f"manifest uses hash {algorithm!r}; this node uses {HASH_ALGORITHM}")
    piece_size = data.get("piece_size")
    if isinstance(piece_size, bool) or not isinstance(piece_size, int):
        raise ManifestError("manifest page has no integer piece_size")
    if expected_piece_size is not None and piece_size != expected_piece_size:
        raise ManifestError(
            f"peer cuts files into {piece_size}-byte pieces, this node into "
            f"{expected_piece_size}; configure the same piece size on every node"
        )
    raw_entries = data.get("entries")
    following = data.get("next")
    etag = data.get("etag", "")
    shared_id = data.get("shared_id")
    category = data.get("category", "")
    if not isinstance(raw_entries, list):
        raise ManifestError("manifest page has no entries list")
    if following is not None and not isinstance(following, str):
        raise ManifestError("manifest page's next cursor must be a string or null")
    if not isinstance(etag, str) or not isinstance(category, str):
        raise ManifestError("manifest page's etag and category must be strings")
    if shared_id is not None and not isinstance(shared_id, str):
        raise ManifestError("manifest page's shared_id must be a string or null")
    entries = tuple(parse_entry(item, piece_size) for item in raw_entries)
    return ManifestPage(category, piece_size, entries, following, etag, shared_id)
