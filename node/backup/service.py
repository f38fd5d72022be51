"""POST /v1/backup: the daemon takes a snapshot of itself and streams the archive."""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, Field

from config.declare import Caller, Refusal, route
from node.backup.archive import Progress
from node.backup.snapshot import STAGING_PREFIX, BackupSources, write_backup
from node.errors import BackupError, BodyError
from node.openapi import BINARY, BODY_CONFIG, parse_body
from node.runtime import NodeRuntime
from node.security import bad_request, json_error
from sync import FileCatalog

log = logging.getLogger(__name__)

BACKUP_PATH = "/v1/backup"
ARCHIVE_TYPE = "application/x-tar"
STREAM_CHUNK_BYTES = 1 << 20
HEADER_MEMBERS = "X-Shoal-Backup-Members"


class BackupBody(BaseModel):
    """What a backup holds beyond the databases, job records, node id, config and file list."""

    model_config = BODY_CONFIG
    with_files: bool = Field(
        default=False, description="also the bytes of every synced file (models, training...)"
    )


class BackupService:
    """Takes backups of this node, one at a time; the archive is staged in the data dir."""

    def __init__(
        self,
        runtime: NodeRuntime,
        store_paths: Mapping[str, Path],
        catalog: Callable[[], FileCatalog | None],
    ) -> None:
        self._runtime = runtime
        self._store_paths = dict(store_paths)
        self._catalog = catalog
        self._lock = asyncio.Lock()

    async def sources(self, with_files: bool) -> BackupSources:
        """What this node's backup reads, with the synced files listed now."""
        runtime = self._runtime
        settings = runtime.settings
        catalog = self._catalog()
        files: list[dict[str, object]] = []
        roots: dict[str, Path] = {}
        if catalog is not None:
            for category in catalog.categories:
                roots[category] = catalog.root(category)
                listing = await catalog.listing(category)
                files.extend(
                    {"category": category, "path": e.path, "size": e.size, "hash": e.hash}
                    for e in listing.entries
                )
        return BackupSources(
            node_id=runtime.node_id,
            cluster=settings.cluster_name,
            version=runtime.version,
            data_dir=settings.data_dir,
            wal_path=settings.wal_path,
            store_paths=self._store_paths,
            file_roots=roots,
            config_json=settings.model_dump_json(indent=1).encode(),
            files=tuple(files),
            with_files=with_files,
        )

    async def take(self, out: Path, staging: Path, with_files: bool) -> dict[str, int]:
        """Write this node's backup archive to `out`; its manifest summary."""
        sources = await self.sources(with_files)
        busy_s = self._runtime.settings.timeouts.sqlite_busy_s
        started = time.monotonic()
        manifest = await asyncio.to_thread(
            write_backup, sources, staging, out, busy_s, time.time(), _logged_progress()
        )
        log.info(
            "backup of %s: %d members in %.1f s",
            sources.node_id,
            len(manifest.members),
            time.monotonic() - started,
        )
        return {"members": len(manifest.members)}

    @route(
        "POST",
        BACKUP_PATH,
        callers=[Caller.OPERATOR],
        answers=((200, "the archive"),),
        errors=[
            Refusal(400, "bad_request", "malformed body"),
            Refusal(409, "conflict", "another backup of this node is running"),
            Refusal(500, "internal_error", "the snapshot failed (a full disk, a damaged database)"),
        ],
        body=BackupBody,
        body_optional=True,
        answer=BINARY,
        answer_type=ARCHIVE_TYPE,
    )
    async def _handle_backup(self, request: web.Request) -> web.StreamResponse:
        """A consistent snapshot of this node while it serves (SQLite online backup of every
        database, job records, node id, config, synced file list), as one tar archive whose
        last member MANIFEST.json lists every member's sha256"""
        try:
            body = parse_body(BackupBody, await request.read(), optional=True)
        except BodyError as exc:
            raise bad_request(exc.reason, param="body") from None
        if self._lock.locked():
            reason = "another backup of this node is running; retry after it"
            return json_error(409, reason, code="backup_running")
        async with self._lock:
            staging = self._runtime.settings.data_dir / f"{STAGING_PREFIX}{secrets.token_hex(4)}"
            try:
                staging.mkdir(parents=True)
                out = staging / "archive.tar"
                summary = await self.take(out, staging, body.with_files)
                return await _stream(request, out, summary)
            except BackupError as exc:
                log.error("backup failed: %s", exc)
                return json_error(500, f"the backup failed: {exc}", code="backup_failed")
            finally:
                await asyncio.to_thread(shutil.rmtree, staging, True)


async def _stream(request: web.Request, out: Path, summary: dict[str, int]) -> web.StreamResponse:
    response = web.StreamResponse()
    response.content_type = ARCHIVE_TYPE
    response.content_length = (await asyncio.to_thread(out.stat)).st_size
    response.headers[HEADER_MEMBERS] = str(summary["members"])
    await response.prepare(request)
    try:
        with out.open("rb") as f:
            while chunk := await asyncio.to_thread(f.read, STREAM_CHUNK_BYTES):
                await response.write(chunk)
        await response.write_eof()
    except ConnectionError as exc:
        log.warning("backup: the client left before the archive ended: %s", exc)
    return response


def _logged_progress() -> Progress:
    last = {"name": ""}

    def progress(name: str, done: int) -> None:
        if name != last["name"]:
            last["name"] = name
            log.debug("backup: %s", name)
        del done

    return progress
