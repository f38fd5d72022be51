"""`shoal backup --out FILE` (a running node's snapshot, taken by the daemon) and `shoal restore
FILE --data-dir DIR` (every byte verified before anything is written)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from config import NodeSettings, fsync_directory, read_error
from node.cli.common import (
    EXIT_FAILURE,
    ConfigOption,
    JsonOption,
    NodeOption,
    console,
    err_console,
    fail,
    node_url,
    peer_client,
    print_json,
    settings_from,
)
from node.errors import ArchiveError, BackupError, PeerRequestError, peer_error

CHUNK_BYTES = 1 << 20
BACKUP_TIMEOUT_FACTOR = 120
"""A backup may take this many HTTP request timeouts (it copies every database first)."""


@contextlib.contextmanager
def _progress(label: str, total: int | None, quiet: bool) -> Iterator[Callable[[int], None]]:
    """A byte progress bar on stderr (none with `quiet`); yields `update(bytes_done)`."""
    if quiet:
        yield lambda done: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, TransferSpeedColumn(), console=err_console) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)


async def fetch_backup(
    settings: NodeSettings, url: str, out: Path, with_files: bool, quiet: bool
) -> dict[str, Any]:
    """POST /v1/backup and write the archive to `out` durably (temp name, fsync, rename)."""
    temp = out.with_name(f".{out.name}.partial")
    digest = hashlib.sha256()
    size = 0
    timeout_s = settings.timeouts.http_request_s * BACKUP_TIMEOUT_FACTOR
    if not quiet:
        err_console.print(f"{url}: taking a snapshot of the node...", highlight=False)
    async with (
        peer_client(settings, timeout_s) as peers,
        peers.stream(
            "POST", url, "/v1/backup", json={"with_files": with_files}, check=False
        ) as response,
    ):
        if response.status >= 400:
            answer = read_error(response.status, await response.read())
            raise PeerRequestError.from_answer(url, answer)
        members = response.headers.get("X-Shoal-Backup-Members", "?")
        label = f"backup -> {out.name}"
        length = response.headers.get("Content-Length")
        content_length = int(length) if length is not None and length.isdigit() else None
        with _progress(label, content_length, quiet) as update, temp.open("wb") as f:
            async for chunk in response.iter_chunks(CHUNK_BYTES):
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                update(size)
            f.flush()
            os.fsync(f.fileno())
        if content_length is not None and size != content_length:
            raise BackupError(f"{url}: the archive ended after {size} bytes")
    os.replace(temp, out)
    fsync_directory(out.parent.absolute())
    return {"file": str(out), "bytes": size, "sha256": digest.hexdigest(), "members": members}


def backup(
    out: Annotated[Path, typer.Option("--out", help="Archive file to write (a tar).")],
    node: NodeOption = None,
    with_files: Annotated[
        bool, typer.Option("--with-files", help="Also the bytes of every synced file.")
    ] = False,
    config_file: ConfigOption = None,
    json_output: JsonOption = False,
) -> None:
    """Take a consistent backup of a running node (it keeps serving) into one archive.

    Exit codes: 0 written; 1 the node is unreachable or refused; 2 usage or config."""
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    temp = out.with_name(f".{out.name}.partial")
    try:
        summary = asyncio.run(fetch_backup(settings, url, out, with_files, json_output))
    except (TimeoutError, OSError) as exc:
        temp.unlink(missing_ok=True)
        fail(str(peer_error(exc, url)), EXIT_FAILURE)
    except (PeerRequestError, BackupError) as exc:
        temp.unlink(missing_ok=True)
        fail(str(exc), EXIT_FAILURE)
    if json_output:
        print_json(summary)
    else:
        console.print(
            f"{summary['file']}: {summary['members']} members, {summary['bytes']:,} bytes, "
            f"sha256 {summary['sha256']}",
            highlight=False,
        )


def restore(
    archive: Annotated[Path, typer.Argument(help="Archive written by `shoal backup`.")],
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Data dir to restore into (empty or absent).")
    ],
    json_output: JsonOption = False,
) -> None:
    """Verify every member of a backup archive, then restore it into a data dir.

    Exit codes: 0 restored; 1 the data dir cannot be written; 2 a damaged or foreign
    archive, or a data dir holding files the archive would replace (nothing written)."""
    from node.backup import manifest_summary, restore_archive

    if not archive.is_file():
        fail(f"{archive}: no such archive")
    total = archive.stat().st_size
    last: dict[str, int] = {}
    moved = [0]
    try:
        with _progress(f"verify, restore {archive.name}", total * 2, json_output) as update:

            def progress(name: str, done: int) -> None:
                before = last.get(name, 0)
                moved[0] += done - before if done >= before else done  # verified, then written
                last[name] = done
                update(moved[0])

            result = restore_archive(archive, data_dir, progress)
    except ArchiveError as exc:
        fail(f"{archive}: refused, nothing written: {exc}")
    except BackupError as exc:
        fail(str(exc), EXIT_FAILURE)
    summary = {**manifest_summary(result.manifest), "data_dir": str(data_dir)}
    summary["written"] = len(result.written)
    if json_output:
        print_json(summary)
    else:
        console.print(
            f"restored node {summary['node_id']} ({summary['members']} members, "
            f"{summary['bytes']:,} bytes) into {data_dir}; start it with "
            f"`shoal serve --data-dir {data_dir}`",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("backup")(backup)
    app.command("restore")(restore)
