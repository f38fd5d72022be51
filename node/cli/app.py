"""The `shoal` command line: one typer app, each area in its own module."""

from __future__ import annotations

import typer

from config import shoal_version
from node.cli import deploy as cli_deploy
from node.cli import devcluster as cli_devcluster
from node.cli import inspect as cli_inspect
from node.cli import monitor as cli_monitor
from node.cli import rl as cli_rl
from node.cli import serve as cli_serve
from node.cli import sync as cli_sync
from node.cli.ca import ca_app
from node.cli.common import console
from node.cli.hosts import config_app, hosts_app
from node.cli.jobs import jobs_app
from node.cli.records import records_app
from node.cli.runs import runs_app
from node.cli.ssh import ssh_app
from node.cli.wal import wal_app
from node.cli.workers import workers_app

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
app.add_typer(jobs_app, name="jobs")
app.add_typer(runs_app, name="runs")
app.add_typer(ssh_app, name="ssh")
app.add_typer(workers_app, name="workers")
app.add_typer(ca_app, name="ca")
cli_serve.register(app)
cli_inspect.register(app)
cli_devcluster.register(app)
cli_monitor.register(app)
cli_sync.register(app)
cli_deploy.register(app)
cli_rl.register(app)


@app.command("version")
def version() -> None:
    """Print the shoal version."""
    console.print(f"shoal {shoal_version()}", highlight=False)


def main() -> None:
    """Entry point of the `shoal` console script."""
    app()
