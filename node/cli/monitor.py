"""`shoal monitor`: the cluster_monitor dashboard as a shoal command (same options, same exits)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from health import MonitorOptions, run_monitor


def monitor(
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            metavar="URL",
            help="A node's API (http://HOST:PORT); the rest of the cluster is learned from its "
            "peers (repeatable; default: the local node from the config).",
        ),
    ] = None,
    inventory: Annotated[
        Path | None, typer.Option("--inventory", metavar="F", help="Ask every host listed.")
    ] = None,
    secret_file: Annotated[
        Path | None,
        typer.Option("--secret-file", metavar="F", help="Cluster secret (default from config)."),
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until q or Ctrl-C.")] = False,
    interval: Annotated[
        float,
        typer.Option("--interval", metavar="S", help="Seconds between refreshes with --watch."),
    ] = MonitorOptions.interval_s,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (one document per line with --watch).")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", metavar="S", help="Per-request timeout (default 3 s)."),
    ] = None,
) -> None:
    """Every node of the cluster at a glance; exit 0 when all are alive and healthy, else 1."""
    options = MonitorOptions(
        nodes=tuple(node or ()),
        inventory=inventory,
        secret_file=secret_file,
        watch=watch,
        interval_s=interval,
        as_json=as_json,
        timeout_s=timeout,
    )
    raise typer.Exit(run_monitor(options))


def register(app: typer.Typer) -> None:
    """Add `shoal monitor` to the `shoal` app."""
    app.command("monitor")(monitor)
