"""`shoal records status|import|export`: the local node's record stores, over its HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Annotated, Any, NoReturn

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from config import NodeSettings, read_error
from node.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    ConfigOption,
    JsonOption,
    config_errors,
    console,
    err_console,
    fail,
    node_url,
    peer_client,
    print_json,
    settings_from,
)
from node.errors import PeerRequestError
from sync import (
    Cursor,
    IngestResult,
    RecordClient,
    RecordRejectedError,
    RecordRequestError,
    SyncError,
    fetch_page,
)

records_app = typer.Typer(
    help="Record stores (games, rollouts) of a node: status, import, export.",
    no_args_is_help=True,
)

NodeOption = Annotated[
    str | None,
    typer.Option("--node", help="Node API URL; default this host's daemon from the settings."),
]

Line = tuple[int, Any]


@dataclass(frozen=True)
class ImportSummary:
    """What `shoal records import` did; printed as one JSON line at the end."""

    store: str
    file: str
    lines: int
    sent: int
    accepted: int
    duplicates: int
    bad_lines: int


def _target(node: str | None, config_file: Path | None) -> tuple[NodeSettings, str]:
    settings = settings_from(config_file).settings
    return settings, node_url(settings, node)


def _unreachable(url: str, exc: SyncError) -> NoReturn:
    """One line naming the node (once) and its own reason."""
    text = str(exc)
    fail(text if text.startswith(url) else f"{url}: {text}", EXIT_FAILURE)


@records_app.command("status")
def records_status(
    node: NodeOption = None, config_file: ConfigOption = None, as_json: JsonOption = False
) -> None:
    """Count, newest record and size of every record store of the node."""
    settings, url = _target(node, config_file)

    async def fetch() -> Any:
        async with peer_client(settings) as peers:
            answer = await peers.request("GET", url, "/v1/records", check=False)
        if answer.status != 200:
            raise RecordRequestError(str(read_error(answer.status, answer.body)), answer.status)
        return answer.json()

    try:
        with config_errors():
            data = asyncio.run(fetch())
    except PeerRequestError as exc:
        fail(f"cannot reach the node: {exc}", EXIT_FAILURE)
    except SyncError as exc:
        _unreachable(url, exc)
    if as_json:
        print_json(data)
        return
    table = Table(title=f"record stores of {url}")
    for column in ("store", "records", "newest created_at", "size"):
        table.add_column(column)
    for store in data["stores"]:
        newest = store["newest_created_at"]
        table.add_row(
            store["store"],
            str(store["count"]),
            "-" if newest is None else f"{newest:.3f}",
            f"{store['size_bytes'] / 1e6:.1f} MB",
        )
    console.print(table)


def read_batches(
    lines: IO[bytes], batch_size: int, on_bad: Callable[[int, str], None]
) -> Iterator[tuple[list[Line], int]]:
    """(batch of (line number, record), lines read so far) from a JSON-lines file, ending with
    an empty batch. Blank lines are skipped; a line that is not a JSON object goes to `on_bad`
    with its number and is left out."""
    batch: list[Line] = []
    number = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            on_bad(number, f"malformed JSON: {exc}")
            continue
        if not isinstance(record, dict):
            on_bad(number, "expected a JSON object")
            continue
        batch.append((number, record))
        if len(batch) >= batch_size:
            yield batch, number
            batch = []
    if batch:
        yield batch, number
    yield [], number


def rejected_line(exc: RecordRejectedError, batch: list[Line]) -> str:
    """The server's refusal of a batch, pointed at the file line of the record it named."""
    if exc.index is not None and 0 <= exc.index < len(batch):
        _, _, message = exc.reason.partition(": ")
        where = f"{exc.field}: " if exc.field else ""
        return f"line {batch[exc.index][0]}: {where}{message or exc.reason}"
    return exc.reason


@records_app.command("import")
def records_import(
    store: Annotated[str, typer.Argument(help="Record store, e.g. games or rollouts.")],
    file: Annotated[Path, typer.Argument(help="JSON-lines file, one record per line.")],
    node: NodeOption = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=10_000, help="Records per request.")
    ] = 1000,
    config_file: ConfigOption = None,
) -> None:
    """Send a JSON-lines file to the node in batches; each batch is durable when acknowledged."""
    settings, url = _target(node, config_file)
    try:
        handle = file.open("rb")
        size_bytes = file.stat().st_size
    except OSError as exc:
        fail(f"{file}: cannot read: {exc.strerror or exc}", EXIT_USAGE)
    bad: list[int] = []

    def on_bad(number: int, message: str) -> None:
        bad.append(number)
        err_console.print(f"{file}:{number}: {message}", markup=False, highlight=False)

    async def send(progress: Callable[[int, int], None]) -> tuple[ImportSummary, str | None]:
        total, sent, lines = IngestResult(), 0, 0
        rejected = None
        async with (
            peer_client(settings) as peers,
            RecordClient(url, peers=peers, batch_size=batch_size) as client,
        ):
            for batch, lines_read in read_batches(handle, batch_size, on_bad):
                lines = lines_read
                if not batch:
                    continue
                added, count, rejected = await _send_batch(client, store, batch, file, bad)
                total += added
                sent += count
                if rejected:
                    break
                progress(sent, handle.tell())
        summary = ImportSummary(
            store, str(file), lines, sent, total.accepted, total.duplicates, len(bad)
        )
        return summary, rejected

    with handle, _progress(store, size_bytes) as progress, config_errors():
        try:
            summary, rejected = asyncio.run(send(progress))
        except SyncError as exc:
            _unreachable(url, exc)
        except OSError as exc:
            fail(f"{file}: cannot read: {exc}", EXIT_USAGE)
    sys.stdout.write(json.dumps(asdict(summary)) + "\n")
    if rejected:
        fail(f"rejected by {url}: {rejected}", EXIT_FAILURE)
    if bad:
        fail(
            f"{file}: {len(bad)} bad line(s) were skipped (first: line {min(bad)}); "
            "every other line was ingested",
            EXIT_FAILURE,
        )


async def _send_batch(
    client: RecordClient,
    store: str,
    batch: list[Line],
    file: Path,
    bad: list[int],
) -> tuple[IngestResult, int, str | None]:
    """Send one batch. The server refuses a batch whole, naming its first bad record: report
    that line (added to `bad`), drop it and send the rest again, so every good record is
    ingested. What was ingested, how many records were sent, and why the batch was refused
    when the server named no record."""
    while batch:
        try:
            result = await client.send_batch(store, [record for _, record in batch])
        except RecordRejectedError as exc:
            if exc.index is None or not 0 <= exc.index < len(batch):
                first, last = batch[0][0], batch[-1][0]
                return (
                    IngestResult(),
                    0,
                    f"{file}: the batch of lines {first}-{last} was refused and "
                    f"nothing of it ingested: {exc.reason}",
                )
            bad.append(batch[exc.index][0])
            err_console.print(
                f"{file}:{rejected_line(exc, batch).removeprefix('line ')}",
                markup=False,
                highlight=False,
            )
            del batch[exc.index]
            continue
        return result, len(batch), None
    return IngestResult(), 0, None


@contextlib.contextmanager
def _progress(store: str, size_bytes: int) -> Iterator[Callable[[int, int], None]]:
    """update(records sent, bytes read): a rich bar on a terminal, else plain lines on stderr."""
    if not err_console.is_terminal:

        def plain(sent: int, at_bytes: int) -> None:
            err_console.print(
                f"{store}: {sent} records sent ({at_bytes}/{size_bytes} bytes)",
                markup=False,
                highlight=False,
            )

        yield plain
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, TimeRemainingColumn(), console=err_console) as bar:
        task = bar.add_task(f"import {store}", total=size_bytes)

        def update(sent: int, at_bytes: int) -> None:
            bar.update(task, completed=at_bytes, description=f"{store}: {sent} records")

        yield update


@records_app.command("export")
def records_export(
    store: Annotated[str, typer.Argument(help="Record store, e.g. games or rollouts.")],
    since: Annotated[
        float | None, typer.Option("--since", help="Only records with created_at >= this.")
    ] = None,
    node: NodeOption = None,
    page_size: Annotated[
        int, typer.Option("--page-size", min=1, max=10_000, help="Records per request.")
    ] = 1000,
    filters: Annotated[
        list[str] | None,
        typer.Option("--filter", help="NAME=VALUE, e.g. min_quality=0.5 or board_type=hex8."),
    ] = None,
    config_file: ConfigOption = None,
) -> None:
    """Write the store's records as JSON lines to stdout, in (created_at, key) order."""
    settings, url = _target(node, config_file)
    pairs = {}
    for item in filters or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            fail(f"--filter must be NAME=VALUE, got {item!r}")
        pairs[name] = value

    async def export() -> int:
        count = 0
        cursor: Cursor | None = None if since is None else (since, None)
        async with peer_client(settings) as peers:
            while True:
                records, cursor = await fetch_page(peers, url, store, cursor, page_size, pairs)
                sys.stdout.write(
                    "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
                )
                sys.stdout.flush()
                count += len(records)
                if cursor is None:
                    return count

    try:
        with config_errors():
            count = asyncio.run(export())
    except SyncError as exc:
        _unreachable(url, exc)
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): stop quietly, and keep the exit flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    err_console.print(f"exported {count} {store} records", markup=False, highlight=False)
