"""`shoal audit [--since 1h] [--kind K] [--json]`: who did what, on which node and when, from
a node's WAL (GET /v1/audit), or from every member's with --all."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from net import peer_url
from node.cli.common import (
    ConfigOption,
    JsonOption,
    NodeOption,
    console,
    fail,
    node_url,
    print_json,
    request_json,
    settings_from,
)

KINDS = ("job", "deploy", "lock", "run", "keyring", "drain", "gpu", "training", "certificate")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_since(text: str, now: float) -> float:
    """Unix seconds from an age (`90s`, `30m`, `1h`, `2d`), unix seconds, or an ISO 8601 time
    (UTC when it names no zone). Exits 2 on anything else."""
    match = _AGE.match(text.strip())
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--since {text!r}: an age like 1h or 30m, unix seconds, or an ISO 8601 time")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


async def _fetch(settings: Any, url: str, query: str) -> list[dict[str, Any]]:
    """Every page of one node's audit trail."""
    entries: list[dict[str, Any]] = []
    after = 0
    while True:
        answer = await request_json(settings, "GET", f"{url}/v1/audit?{query}&after={after}")
        entries.extend(answer["entries"])
        if answer.get("next_after") is None:
            return entries
        after = int(answer["next_after"])


async def _members(settings: Any, url: str) -> list[str]:
    answer = await request_json(settings, "GET", f"{url}/v1/peers")
    return [
        peer_url(member["address"], member["port"])
        for member in answer["members"]
        if member["state"] == "alive" and not member.get("is_self")
    ]


async def collect(settings: Any, url: str, query: str, everyone: bool) -> list[dict[str, Any]]:
    urls = [url, *(await _members(settings, url))] if everyone else [url]
    pages = await asyncio.gather(*(_fetch(settings, one, query) for one in urls))
    merged = [entry for page in pages for entry in page]
    return sorted(merged, key=lambda entry: (entry["at"], entry["node"], entry["id"]))


def _print(entries: list[dict[str, Any]]) -> None:
    table = Table(title=f"{len(entries)} audit entries")
    for column in ("when (UTC)", "node", "who", "kind", "action", "subject", "outcome", "detail"):
        table.add_column(column)
    for entry in entries:
        when = datetime.fromtimestamp(entry["at"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        detail = ", ".join(f"{key}={value}" for key, value in entry.get("detail", {}).items())
        table.add_row(
            when,
            entry["node"],
            entry["sender"] or "-",
            entry["kind"],
            entry["action"],
            entry["subject"],
            entry.get("outcome", ""),
            detail,
        )
    console.print(table)


def audit(
    since: Annotated[
        str | None, typer.Option("--since", help="Only entries since: 1h, 30m, 2d, or a time.")
    ] = None,
    kind: Annotated[
        str | None, typer.Option("--kind", help=f"Only one kind: {', '.join(KINDS)}.")
    ] = None,
    everyone: Annotated[
        bool, typer.Option("--all", help="Every alive member's trail, merged by time.")
    ] = False,
    node: NodeOption = None,
    config_file: ConfigOption = None,
    json_output: JsonOption = False,
) -> None:
    """List who did what, on which node and when: job starts and kills, gang starts, lock
    grants and releases, run steps, deploys, gossip keyring changes, drains, undrains,
    leaves, GPU quarantines and re-admissions, restarts of the training group (certificate
    lists nothing yet).

    Exit codes: 0 listed; 1 a node is unreachable or refused; 2 usage or config."""
    if kind is not None and kind not in KINDS:
        fail(f"--kind {kind!r}: one of {', '.join(KINDS)}")
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    start = 0.0 if since is None else parse_since(since, time.time())
    query = f"since={start!r}" + (f"&kind={kind}" if kind else "")
    entries = asyncio.run(collect(settings, url, query, everyone))
    if json_output:
        print_json({"entries": entries})
    else:
        _print(entries)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)
