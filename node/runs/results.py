"""The results store of runs, `local` backend: a directory on the coordinator's host, or on the
node named by `results.node` (the coordinator asks that node to fetch each file from its member,
as sync's pushes are pull requests). A file appears at its key only complete, fsynced and
matching the hash its node announced; an upload is reported done only after that.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path, PurePosixPath
from typing import NotRequired, Protocol

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from config import NodeSettings
from net import PeerClient, PeerRequestError
from node.errors import ResultsStoreError
from sync import DEFAULT_PIECE_SIZE
from sync.files.manifest import digest_of_fd

FETCH_PATH = "/v1/results/fetch"
FETCH_TIMEOUT_FACTOR = 60
"""A fetch by the results node may move a large file: this many http_request_s."""


def result_key(run_id: str, node: str, path: str) -> str:
    """`runs/<run_id>/<node>/<path>`; ResultsStoreError for a path that leaves its folder."""
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
        raise ResultsStoreError(
            400, "bad_result_path", f"result path {path!r}: relative, without '..'"
        )
    return str(PurePosixPath("runs", run_id, node, *parts))


class FetchJson(TypedDict):
    """The body of `POST /v1/results/fetch` (node.runs.fetch.FetchBody) a run sends."""

    key: str
    node: str
    job_id: str
    path: str


class StoredResultJson(TypedDict):
    """A result file as a store answers it: key, size, hash and where it is (`store`; s3 adds
    sha256 and etag), or {key, missing: true}; a run's `uploaded` adds node and path."""

    key: str
    size: NotRequired[int]
    hash: NotRequired[str]
    sha256: NotRequired[str]
    etag: NotRequired[str]
    store: NotRequired[str]
    missing: NotRequired[bool]
    node: NotRequired[str]
    path: NotRequired[str]


STORED_RESULT: TypeAdapter[StoredResultJson] = TypeAdapter(StoredResultJson)
"""Validation of a results node's answer (StoredResultJson)."""


def check_key(key: object) -> str:
    """A key shaped `runs/<run_id>/<node>/<path>`; ResultsStoreError 400 otherwise (the caller
    compares it with result_key of its parts, which refuses '..' and odd spellings)."""
    if not isinstance(key, str) or len(key.split("/")) < 4 or not key.startswith("runs/"):
        raise ResultsStoreError(
            400, "bad_result_key", f"a key runs/<run>/<node>/<path>, not {key!r}"
        )
    return key


def _write_verified(root: Path, key: str, temp: Path, expected: str | None) -> StoredResultJson:
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
    return StoredResultJson(key=key, size=size, hash=digest, store="local")


class LocalResults:
    """Results under `root` (created on first use)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def put(
        self, key: str, chunks: AsyncIterator[bytes], expected_hash: str | None
    ) -> StoredResultJson:
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


class NodeResults:
    """Results in the `local` store of node `node`: `collect` asks that node (POST
    /v1/results/fetch) to fetch one member's file and store it; it answers once stored."""

    def __init__(self, node: str, timeout_s: float) -> None:
        self.node = node
        self.timeout_s = timeout_s

    async def collect(
        self,
        peers: PeerClient,
        url: str | None,
        fetch: FetchJson,
        headers: Mapping[str, str] | None = None,
    ) -> StoredResultJson:
        """Have the results node (at `url`) fetch `fetch` = {key, node, job_id, path};
        `headers` carry the coordinator's plan fence."""
        if url is None:
            raise ResultsStoreError(
                503,
                "results_node_unknown",
                f"results node {self.node} is not in the membership view; start it or change "
                "results.node",
            )
        try:
            status, answer = await peers.call_json(
                "POST", url, FETCH_PATH, dict(fetch), timeout_s=self.timeout_s, headers=headers
            )
        except PeerRequestError as exc:
            raise ResultsStoreError(
                502, "results_node_unreachable", f"results node {self.node}: {exc.reason}"
            ) from exc
        if status != 200 or not isinstance(answer, dict):
            reason = answer.get("reason") if isinstance(answer, dict) else answer
            raise ResultsStoreError(
                502,
                "results_node_refused",
                f"results node {self.node} did not store {fetch['key']}: {status} {reason}",
            )
        try:
            return STORED_RESULT.validate_python(answer)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in error["loc"]) or "answer"
            raise ResultsStoreError(
                502,
                "results_node_refused",
                f"results node {self.node} answered for {fetch['key']} a record that cannot "
                f"be read: {where}: {error['msg']}",
            ) from None


class ResultsStore(Protocol):
    """Where runs put the files they collect: `put` returns only once the store holds the
    file, checked against `expected_hash` (sync's content hash of the node's copy)."""

    async def put(
        self, key: str, chunks: AsyncIterator[bytes], expected_hash: str | None
    ) -> StoredResultJson: ...


def open_results_store(settings: NodeSettings) -> ResultsStore | NodeResults:
    """The store of the `results:` section (s3 is imported only when configured): on the node
    `results.node` names (or on every node when unset) the local directory, elsewhere that
    node reached over the API."""
    section = settings.results
    local_root = section.path or settings.data_dir / "results"
    if section.backend == "local":
        if section.node is not None and section.node != settings.node_id:
            return NodeResults(
                section.node, settings.timeouts.http_request_s * FETCH_TIMEOUT_FACTOR
            )
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
