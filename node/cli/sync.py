"""`shoal sync [CATEGORY ...]` and `shoal sync status`: ask a daemon to sync now, or how it went."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from config import NodeSettings
from node.cli.common import (
    EXIT_FAILURE,
    console,
    err_console,
    node_url,
    print_json,
    request_json,
    settings_from,
)

log = logging.getLogger(__name__)


async def _request(settings: NodeSettings, method: str, url: str, body: object = None) -> Any:
    return await request_json(settings, method, url, body, timeout_s=settings.timeouts.sync_s * 2)


def _print_run(result: dict[str, Any]) -> None:
    table = Table(title=f"sync from {', '.join(result.get('peers', [])) or 'no peers'}")
    for column in ("category", "transferred", "bytes", "errors"):
        table.add_column(column)
    stale: list[str] = []
    for category, stats in result.get("files", {}).items():
        deleted = stats.get("deleted", 0)
        table.add_row(
            category,
            f"{stats['files_transferred']} files" + (f", {deleted} deleted" if deleted else ""),
            f"{stats['bytes_transferred']:,}",
            "; ".join(stats["errors"]) or "-",
        )
        if stats.get("stale_beyond_tombstone_ttl"):
            stale.append(f"{category} ({stats.get('resurrected', 0)} files no peer has)")
    for store, stats in result.get("records", {}).items():
        table.add_row(
            store,
            f"{stats['inserted']} new records ({stats['duplicates']} duplicates)",
            "-",
            "; ".join(stats["errors"]) or "-",
        )
    console.print(table)
    if stale:
        console.print(
            "stale_beyond_tombstone_ttl: this node had not synced "
            f"{', '.join(stale)} for longer than tombstone_ttl_s; deletions made meanwhile "
            "are forgotten and such files may come back (see the daemon's log)",
            highlight=False,
        )
    console.print(f"took {result.get('duration_seconds', 0):.2f} s", highlight=False)


def _print_fanout(fanout: dict[str, Any]) -> None:
    """Bytes served to peers per category, and where swarm downloads got their pieces."""
    if not fanout:
        return
    table = Table(title="fan-out")
    for column in ("category", "served to peers", "pieces from peers", "pieces from origins"):
        table.add_column(column)
    for category, counts in fanout.items():
        table.add_row(
            category,
            f"{counts.get('served_bytes', 0):,} B",
            f"{counts.get('from_peers_bytes', 0):,} B",
            f"{counts.get('from_origin_bytes', 0):,} B",
        )
    console.print(table)


async def _run_with_progress(
    settings: NodeSettings, base: str, run: Coroutine[Any, Any, Any]
) -> Any:
    """Await `run` while a progress bar follows the daemon's counters (files, bytes, rate, ETA)."""
    task = asyncio.ensure_future(run)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.fields[files]}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console, transient=True) as progress:
        bar = progress.add_task("sync", total=None, files="listing peers")
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if task.done():
                break
            try:
                status = await _request(settings, "GET", f"{base}/v1/sync/status")
            except (typer.Exit, Exception) as exc:  # the run's answer decides; a poll may miss
                log.debug("progress poll failed: %s", exc)
                continue
            counts = status.get("progress") or {}
            if counts.get("files_total"):
                progress.update(
                    bar,
                    total=counts["bytes_total"] or None,
                    completed=counts["bytes_done"],
                    files=f"{counts['files_done']}/{counts['files_total']} files",
                )
    return await task


def sync(
    categories: Annotated[
        list[str] | None,
        typer.Argument(
            help="Categories to sync (models, training, configs, games, rollouts, or a record "
            "store); none: all. `shoal sync status` shows the last run instead."
        ),
    ] = None,
    source: Annotated[
        str | None, typer.Option("--from", help="Pull only from this peer (node id).")
    ] = None,
    node: Annotated[
        str | None, typer.Option("--node", help="Daemon URL; default the local node.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="Config file (YAML); default $SHOAL_CONFIG.")
    ] = None,
) -> None:
    """Ask the daemon to sync now and wait until it is done; exit 1 if any transfer failed."""
    settings = settings_from(config_file).settings
    base = node_url(settings, node)
    if categories == ["status"]:
        status = asyncio.run(_request(settings, "GET", f"{base}/v1/sync/status"))
        if as_json:
            print_json(status)
        elif status.get("last_run"):
            console.print(
                f"running: {status['running']}; peers: {', '.join(status['peers']) or '-'}",
                highlight=False,
            )
            _print_run(status["last_run"])
        else:
            console.print(f"no sync has run yet; peers: {', '.join(status['peers']) or '-'}")
        if not as_json:
            _print_fanout(status.get("fanout") or {})
        return
    body = {"categories": categories or [], "from": source}
    coroutine = _request(settings, "POST", f"{base}/v1/sync/run", body)
    if sys.stderr.isatty() and not as_json:
        result = asyncio.run(_run_with_progress(settings, base, coroutine))
    else:
        result = asyncio.run(coroutine)
    if as_json:
        print_json(result)
    else:
        _print_run(result)
    failed = any(s["errors"] for s in result.get("files", {}).values()) or any(
        s["errors"] for s in result.get("records", {}).values()
    )
    if failed:
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    app.command("sync")(sync)
