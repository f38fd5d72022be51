"""Many small files in one request: the framed stream of `POST /v1/sync/{category}/files`.

The answer is a sequence of frames, one per file asked for, in the order asked: a 4-byte
big-endian header length, a JSON header, then `size` bytes. A header is either
`{"path", "size", "hash"}` (the bytes follow) or `{"path", "error", "status", "reason"}` (no
bytes): the file is missing (404), has another hash now (412) or is not hashed in the
manifest cache yet (409; the puller fetches it alone, which hashes it). The server never
hashes here: the hash comes from its manifest cache, whose stat key the open file must match.

The puller verifies each file's bytes against its manifest hash, writes it to a temp file,
fsyncs it and renames it into place (so a crash leaves each file absent or complete), and
fsyncs each directory once per batch.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from config import fsync_directory
from sync.errors import ContentMismatchError, FileSyncError, PathRefusedError
from sync.files.manifest import ManifestEntry, content_hash
from sync.files.manifest_cache import StatKey, stat_key
from sync.guards import dest_path, open_inside, temp_name
from sync.transports.partial import make_directories

HEADER = struct.Struct(">I")
MAX_HEADER_BYTES = 64 << 10
MAX_BATCH_FILES = 2000
MAX_BATCH_FILE_BYTES = 16 << 20
"""The largest file a batch carries; bigger ones go through the ranged file route."""


def frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame: length, JSON header, bytes."""
    text = orjson.dumps(header)
    return HEADER.pack(len(text)) + text + body


def parse_header(raw: bytes) -> dict[str, Any]:
    """A frame header, checked; FileSyncError when it is not a JSON object with a path."""
    try:
        header = orjson.loads(raw)
    except ValueError as exc:  # orjson.JSONDecodeError
        raise FileSyncError(f"batch frame header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("path"), str):
        raise FileSyncError("batch frame header has no path")
    size = header.get("size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FileSyncError(f"batch frame of {header['path']}: bad size {size!r}")
    return header


def read_served_file(
    root: Path, path: str, wanted: str, cached: tuple[ManifestEntry, StatKey] | None
) -> bytes:
    """The frame of one file for the server: its bytes when the open file still matches the
    cached manifest entry (stat key) and that entry has hash `wanted`. Blocking."""
    try:
        fd, info = open_inside(root, path)
    except (FileNotFoundError, NotADirectoryError):
        return frame({"path": path, "error": "not_found", "status": 404, "reason": "no such file"})
    except PathRefusedError as exc:
        return frame({"path": path, "error": "bad_path", "status": 400, "reason": str(exc)})
    try:
        if cached is None or cached[1] != stat_key(info):
            reason = "not hashed yet; fetch it alone"
            return frame({"path": path, "error": "stale", "status": 409, "reason": reason})
        entry = cached[0]
        if entry.hash != wanted:
            reason = "the file no longer has that hash"
            return frame(
                {
                    "path": path,
                    "error": "changed",
                    "status": 412,
                    "reason": reason,
                    "hash": entry.hash,
                }
            )
        if info.st_size > MAX_BATCH_FILE_BYTES:
            reason = f"larger than {MAX_BATCH_FILE_BYTES} bytes; fetch it alone"
            return frame({"path": path, "error": "too_large", "status": 413, "reason": reason})
        data = os.pread(fd, info.st_size + 1, 0)
        if len(data) != info.st_size or stat_key(os.fstat(fd)) != stat_key(info):
            reason = "changed while being read"
            return frame({"path": path, "error": "stale", "status": 409, "reason": reason})
        return frame({"path": path, "size": len(data), "hash": entry.hash}, data)
    finally:
        os.close(fd)


def hash_bytes(data: bytes, piece_size: int) -> str:
    """The manifest hash of `data` (see sync.files.manifest)."""
    view = memoryview(data)
    digests = [
        hashlib.sha256(view[offset : offset + piece_size]).digest()
        for offset in range(0, len(data), piece_size)
    ] or [hashlib.sha256(b"").digest()]
    return content_hash(digests)


@dataclass
class BatchWriter:
    """Installs the files of one batch under `root` (blocking methods; call from a thread):
    each verified, written to a temp file, fsynced and renamed into place; `finish()` fsyncs
    every directory touched once."""

    root: Path
    directories: set[Path]
    created: set[Path]

    @classmethod
    def at(cls, root: Path) -> BatchWriter:
        return cls(root, set(), set())

    def install(
        self, items: list[tuple[ManifestEntry, bytes]]
    ) -> list[os.stat_result | FileSyncError]:
        """Install each (entry, bytes); per item its stat, or the error that kept it out."""
        out: list[os.stat_result | FileSyncError] = []
        for entry, data in items:
            try:
                out.append(self._install_one(entry, data))
            except FileSyncError as exc:
                out.append(exc)
            except OSError as exc:
                out.append(FileSyncError(f"{entry.path}: cannot install: {exc}"))
        return out

    def _install_one(self, entry: ManifestEntry, data: bytes) -> os.stat_result:
        got = hash_bytes(data, entry.piece_size)
        if len(data) != entry.size or got != entry.hash:
            raise ContentMismatchError(
                f"{entry.path}: received {len(data)} bytes hashing to {got[:16]}, expected "
                f"{entry.size} bytes hashing to {entry.hash[:16]}"
            )
        final = dest_path(self.root, entry.path)
        directory = final.parent
        if directory not in self.created:
            make_directories(self.root, directory)
            self.created.add(directory)
        temp = directory / temp_name(final.name)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.utime(fd, ns=(time.time_ns(), entry.mtime_ns))
            os.fsync(fd)
            os.replace(temp, final)
            info = os.fstat(fd)
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        os.close(fd)
        self.directories.add(directory)
        return info

    def finish(self, sync_dir: Callable[[Path], None] | None = None) -> None:
        """One fsync per directory a file was renamed into (`sync_dir`, default
        config.fsync_directory)."""
        for directory in sorted(self.directories):
            (sync_dir or fsync_directory)(directory)
        self.directories.clear()
