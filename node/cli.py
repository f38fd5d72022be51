"""The `shoal` command line: one typer app, each area in its own module."""

from __future__ import annotations

import typer

from config import shoal_version
from node import cli_monitor, cli_serve, cli_sync
from node.cli_common import console
from node.cli_hosts import config_app, hosts_app
from node.cli_records import records_app
from node.cli_wal import wal_app

app = typer.Typer(
    name="shoal",
    help="shoal: peer-to-peer node service for GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(hosts_app, name="hosts")
app.add_typer(config_app, name="config")
app.add_typer(wal_app, name="wal")
app.add_typer(records_app, name="records")
cli_serve.register(app)
cli_monitor.register(app)
cli_sync.register(app)


@app.command("version")
def version() -> None:
    """Print the shoal version."""
    console.print(f"shoal {shoal_version()}", highlight=False)


def main() -> None:
    """Entry point of the `shoal` console script."""
    app()
