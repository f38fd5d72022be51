"""`shoal wal status|pending|cleanup|open`: the durable operation log of the local node."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.table import Table

from node.cli.common import (
    EXIT_FAILURE,
    ConfigOption,
    JsonOption,
    console,
    fail,
    print_json,
    settings_from,
)
from wal import WalCorruptError, WalError, WriteAheadLog, move_aside

wal_app = typer.Typer(help="Inspect and maintain the write-ahead log.", no_args_is_help=True)

T = TypeVar("T")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_s(text: str) -> float:
    """`90`, `90s`, `15m`, `24h`, `7d` -> seconds; ValueError otherwise."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 24h, 7d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


DataDirOption = Annotated[
    Path | None,
    typer.Option("--data-dir", help="The node's data dir (default from the config); its WAL."),
]


def _wal_path(config_file: Path | None, data_dir: Path | None = None) -> Path:
    flags = {"data_dir": data_dir} if data_dir is not None else None
    return settings_from(config_file, flags).settings.wal_path


def _with_wal(path: Path, action: Callable[[WriteAheadLog], Awaitable[T]]) -> T:
    if not path.exists():
        fail(f"{path}: no WAL here yet (the daemon creates it on first start)", EXIT_FAILURE)

    async def run() -> T:
        async with WriteAheadLog(path) as wal:
            return await action(wal)

    try:
        return asyncio.run(run())
    except WalCorruptError as exc:
        fail(str(exc))
    except WalError as exc:
        fail(f"{path}: {exc}", EXIT_FAILURE)


@wal_app.command("status")
def wal_status(
    config_file: ConfigOption = None, data_dir: DataDirOption = None, as_json: JsonOption = False
) -> None:
    """Counts of pending, committed and failed operations, the oldest pending, file sizes."""
    path = _wal_path(config_file, data_dir)
    stats = _with_wal(path, lambda wal: wal.stats())
    document: dict[str, object] = {"path": str(path), **dataclasses.asdict(stats)}
    if as_json:
        print_json(document)
        return
    table = Table(show_header=False, title=f"WAL {path}")
    for key, value in document.items():
        table.add_row(key, "-" if value is None else str(value))
    console.print(table)


@wal_app.command("pending")
def wal_pending(
    entry_type: Annotated[
        str | None, typer.Option("--type", help="Only entries of this type.")
    ] = None,
    config_file: ConfigOption = None,
    data_dir: DataDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Operations not yet committed, oldest first."""
    path = _wal_path(config_file, data_dir)
    entries = _with_wal(path, lambda wal: wal.pending(entry_type))
    rows = [
        {
            **dataclasses.asdict(entry),
            "state": entry.state.value,
            "age_s": time.time() - entry.created_at,
        }
        for entry in entries
    ]
    if as_json:
        print_json({"path": str(path), "pending": rows})
        return
    table = Table(title=f"{len(rows)} pending in {path}")
    for column in ("id", "type", "key", "age", "retries", "error"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["id"]),
            row["entry_type"],
            row["key"] or "-",
            f"{row['age_s']:.0f} s",
            str(row["retries"]),
            row["error"] or "",
        )
    console.print(table)


@wal_app.command("cleanup")
def wal_cleanup(
    older_than: Annotated[
        str, typer.Option("--older-than", help="Age of finished entries to delete: 90s, 15m, 24h.")
    ] = "24h",
    config_file: ConfigOption = None,
    data_dir: DataDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete finished (committed, rolled back, failed) entries older than a duration."""
    try:
        older_than_s = parse_duration_s(older_than)
    except ValueError as exc:
        fail(f"--older-than: {exc}")
    path = _wal_path(config_file, data_dir)
    removed = _with_wal(path, lambda wal: wal.cleanup(older_than_s=older_than_s))
    if as_json:
        print_json({"path": str(path), "removed": removed, "older_than_s": older_than_s})
    else:
        console.print(
            f"removed {removed} finished entries older than {older_than}", highlight=False
        )


@wal_app.command("open")
def wal_open(
    move_aside_corrupt: Annotated[
        bool,
        typer.Option(
            "--move-aside",
            help="If the WAL is corrupt or not a shoal WAL, rename it (and its -wal/-shm) to "
            "NAME.corrupt-TIME and create an empty one. Pending operations in it are NOT replayed.",
        ),
    ] = False,
    config_file: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Check that the WAL opens cleanly; with --move-aside, set a damaged one aside."""
    path = _wal_path(config_file, data_dir)

    async def check() -> int:
        async with WriteAheadLog(path) as wal:
            return (await wal.stats()).pending

    try:
        pending = asyncio.run(check())
    except WalCorruptError as exc:
        if not move_aside_corrupt:
            fail(str(exc))
        moved = move_aside(path)
        console.print(f"moved the damaged WAL to {moved}; starting an empty one", highlight=False)
        pending = asyncio.run(check())
    except WalError as exc:
        fail(f"{path}: {exc}", EXIT_FAILURE)
    console.print(f"{path}: ok, {pending} pending", highlight=False)
