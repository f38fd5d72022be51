"""`shoal workers serve`: a worker server (the remote end of `RemoteWorker`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from config import ConfigError
from node.workers import WorkerError, WorkerServer, load_secret, load_work_fn

workers_app = typer.Typer(
    help="Miniray-style workers: a server that forks one worker per authenticated connection.",
    no_args_is_help=True,
)


@workers_app.command("serve")
def serve(
    work_fn: Annotated[str, typer.Option("--work-fn", help="module:function run per worker")],
    port: Annotated[int, typer.Option(help="TCP port (0: any free port)")] = 0,
    workers: Annotated[int, typer.Option(help="how many workers may run at once")] = 1,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    secret_file: Annotated[
        Path | None, typer.Option(help="cluster secret; without it only loopback may connect")
    ] = None,
) -> None:
    """Listen; print {"event": "listening", "port": P} on stdout once connections are taken."""
    try:
        server = WorkerServer(
            load_work_fn(work_fn), host, port, max_workers=workers, secret=load_secret(secret_file)
        )
    except (WorkerError, ConfigError) as exc:
        typer.echo(f"shoal workers serve: {exc}", err=True)
        raise typer.Exit(2) from exc
    server.install_signal_handlers()
    event = {"event": "listening", "host": host, "port": server.port, "workers": workers}
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()
    server.serve_forever()
