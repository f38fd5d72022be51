"""`shoal training [--json] [--node URL]`: the training group as any node sees it (GET
/v1/training): every rank's step, rate, compute time and straggler flag, whether the group is
hung, its restarts and the nodes that did not answer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import typer

from node.cli import common
from node.cli.common import (
    ConfigOption,
    JsonOption,
    NodeOption,
    daemon_of,
    print_json,
    request_json,
)

RESTARTS_SHOWN = 10


def _seconds(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ranks_table(document: dict[str, Any]) -> Any:
    from rich.table import Table  # here: --json needs no rich

    hung = "[bold red]HUNG[/]" if document["hung"] else "advancing"
    table = Table(
        title=f"generation {document['generation']}, world {document['world_size']}: {hung} "
        f"(hang timeout {document['hang_timeout_s']:g} s; answered by "
        f"{document['answered_by']}, coordinator {document.get('coordinator') or '-'})"
    )
    columns = ("rank", "node", "local", "step", "steps/s", "compute s", "last report", "straggler")
    for column in (*columns, "GPU", "scalars"):
        table.add_column(column)
    for rank in document["ranks"]:
        scalars = ", ".join(f"{k}={v:.4g}" for k, v in sorted(rank.get("scalars", {}).items()))
        table.add_row(
            str(rank["rank"]),
            rank["node"],
            str(rank["local_rank"]),
            str(rank["step"]),
            f"{rank['steps_per_s']:.2f}",
            _seconds(rank.get("compute_s")),
            f"{rank['last_report_age_s']:.1f} s ago",
            "[bold yellow]yes[/]" if rank.get("straggler") else "",
            rank.get("gpu") or "-",
            scalars,
        )
    return table


def _restarts_table(restarts: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title=f"restarts (the last {RESTARTS_SHOWN} of {len(restarts)})")
    for column in ("when (UTC)", "generation", "reason", "detail"):
        table.add_column(column)
    for restart in restarts[-RESTARTS_SHOWN:]:
        table.add_row(
            _when(restart["at"]), str(restart["generation"]), restart["reason"], restart["detail"]
        )
    return table


def _print(document: dict[str, Any]) -> None:
    console = common.console
    if document.get("generation") is None:
        console.print(f"nobody trains (answered by {document['answered_by']})", highlight=False)
    else:
        console.print(_ranks_table(document))
    if document.get("missing"):
        missing = ", ".join(document["missing"])
        console.print(f"[yellow]partial: no answer in time from {missing}[/]", highlight=False)
    for event in document.get("stragglers", [])[-RESTARTS_SHOWN:]:
        console.print(
            f"{_when(event['at'])} straggler: rank {event['rank']} on {event['node']} "
            f"(GPU {event.get('gpu') or '-'}) compute {event['compute_s']:.3f} s, group median "
            f"{event['median_s']:.3f} s ({event['action']})",
            highlight=False,
        )
    if document.get("restarts"):
        console.print(_restarts_table(document["restarts"]))
    _print_checkpoints(document)


def _print_checkpoints(document: dict[str, Any]) -> None:
    """The committed step with the nodes holding each node's files, and each node's last
    restore (where from, how much, how long)."""
    console = common.console
    committed = document.get("committed")
    if committed:
        held = "; ".join(
            f"{owner} on {', '.join(nodes) or 'nobody else'}"
            for owner, nodes in sorted(committed.get("holders", {}).items())
        )
        console.print(
            f"committed: step {committed['step']} at {_when(committed['at'])}, "
            f"{committed['bytes']:,} bytes; copies: {held or '-'}",
            highlight=False,
        )
    else:
        console.print("committed: no checkpoint step yet", highlight=False)
    for node, part in sorted(document.get("nodes", {}).items()):
        restore = part.get("last_restore")
        if restore:
            console.print(
                f"{node} last restore: step {restore['step']} from {restore['from']}, "
                f"{restore['bytes']:,} bytes in {_seconds(restore['seconds'])} s",
                highlight=False,
            )


def training(
    node: NodeOption = None, as_json: JsonOption = False, config_file: ConfigOption = None
) -> None:
    """Show the training group from any node: every rank's step, steps/s, compute time and
    straggler flag, whether the group is hung, its restarts with their reasons, and the
    training nodes that did not answer in time.

    Exit codes: 0 shown; 1 the node is unreachable or refused; 2 usage or config."""
    settings, url = daemon_of(node, config_file)
    wait_s = settings.timeouts.peer_status_s * 2 + settings.timeouts.http_request_s
    document = asyncio.run(request_json(settings, "GET", url + "/v1/training", timeout_s=wait_s))
    if as_json:
        print_json(document)
        return
    _print(document)


def register(app: typer.Typer) -> None:
    """Add `shoal training` to the app."""
    app.command("training")(training)
