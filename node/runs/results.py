"""The results store of runs, `local` backend: a directory on the coordinator's host. A file
appears at its key only complete, fsynced and matching the hash its node announced; an upload
is reported done only after that.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from config import NodeSettings
from node.errors import ResultsStoreError
from sync import DEFAULT_PIECE_SIZE
from sync.files.manifest import digest_of_fd


def result_key(run_id: str, node: str, path: str) -> str:
    """`runs/<run_id>/<node>/<path>`; ResultsStoreError for a path that leaves its folder."""
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
        raise ResultsStoreError(
            400, "bad_result_path", f"result path {path!r}: relative, without '..'"
        )
    return str(PurePosixPath("runs", run_id, node, *parts))


def _write_verified(root: Path, key: str, temp: Path, expected: str | None) -> dict[str, Any]:
    fd = os.open(temp, os.O_RDONLY)
    try:
        size, digest, _ = digest_of_fd(fd, DEFAULT_PIECE_SIZE)
    finally:
        os.close(fd)
    if expected is not None and digest != expected:
        temp.unlink(missing_ok=True)
        raise ResultsStoreError(
            502,
            "result_hash_mismatch",
            f"{key}: stored content hashes to {digest}, its node announced {expected}",
        )
    final = root / key
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(temp, final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return {"key": key, "size": size, "hash": digest, "store": "local"}


class LocalResults:
    """Results under `root` (created on first use)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def put(
        self, key: str, chunks: AsyncIterator[bytes], expected_hash: str | None
    ) -> dict[str, Any]:
        """Store the bytes of `chunks` at `key`, verified against `expected_hash`."""
        temp = self.root / ".incoming" / key.replace("/", "__")
        await asyncio.to_thread(temp.parent.mkdir, parents=True, exist_ok=True)
        try:
            with temp.open("wb") as out:
                async for chunk in chunks:
                    await asyncio.to_thread(out.write, chunk)
                await asyncio.to_thread(out.flush)
                await asyncio.to_thread(os.fsync, out.fileno())
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise ResultsStoreError(500, "results_store_failed", f"{key}: {exc}") from exc
        return await asyncio.to_thread(_write_verified, self.root, key, temp, expected_hash)


class ResultsStore(Protocol):
    """Where runs put the files they collect: `put` returns only once the store holds the
    file, checked against `expected_hash` (sync's content hash of the node's copy)."""

    async def put(
        self, key: str, chunks: AsyncIterator[bytes], expected_hash: str | None
    ) -> dict[str, Any]: ...


def open_results_store(settings: NodeSettings) -> ResultsStore:
    """The store of the `results:` section (s3 is imported only when configured)."""
    section = settings.results
    local_root = section.path or settings.data_dir / "results"
    if section.backend == "local":
        return LocalResults(local_root)
    from node.runs.s3 import S3Results

    assert section.bucket is not None
    assert section.credentials_file is not None
    return S3Results(
        section.endpoint_url or f"https://s3.{section.region}.amazonaws.com",
        section.bucket,
        section.prefix,
        section.credentials_file,
        local_root / ".staging",
        region=section.region,
        timeout_s=settings.timeouts.http_request_s * 6,
    )
