"""`shoal serve`: run the node daemon in the foreground."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from config import ConfigError, LogFormat, NodeSettings
from node.cli.common import EXIT_FAILURE, ConfigOption, fail, settings_from
from node.daemon import NodeDaemon
from node.errors import NodeError
from node.logs import configure_logging
from node.startup import startup_error
from sync import SyncError
from wal import WalCorruptError, WalError

log = logging.getLogger(__name__)


async def _serve(settings: NodeSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    daemon = NodeDaemon(settings)
    configure_logging(
        settings.log_format,
        lambda: daemon.runtime.node_id if daemon.runtime else settings.node_id or "-",
        lambda: daemon.runtime.term if daemon.runtime else None,
    )
    try:
        await daemon.start()
        signalled = asyncio.create_task(stop.wait())
        requested = asyncio.create_task(daemon.stop_requested.wait())
        try:
            await asyncio.wait({signalled, requested}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            signalled.cancel()
            requested.cancel()
        log.info("stopping: leaving the cluster and closing the WAL")
    finally:
        await asyncio.wait_for(daemon.close(), settings.timeouts.shutdown_s)


DAEMON_UMASK = 0o027


def serve(
    config_file: ConfigOption = None,
    inventory: Annotated[
        Path | None, typer.Option("--inventory", help="YAML host inventory.")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="State and data directory.")
    ] = None,
    node_id: Annotated[str | None, typer.Option("--node-id", help="This node's id.")] = None,
    bind: Annotated[
        str | None, typer.Option("--bind", help="Listen address (default 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option("--port", help="API port (default 8770).")] = None,
    advertise: Annotated[
        str | None, typer.Option("--advertise", help="Address peers reach this node at.")
    ] = None,
    seed: Annotated[
        list[str] | None, typer.Option("--seed", help="HOST:PORT of a peer to join (repeatable).")
    ] = None,
    no_mdns: Annotated[bool, typer.Option("--no-mdns", help="Do not use mDNS.")] = False,
    secret_file: Annotated[
        Path | None, typer.Option("--secret-file", help="Cluster secret file (chmod 600).")
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback bind without a secret.")
    ] = False,
    log_format: Annotated[
        LogFormat | None, typer.Option("--log-format", help="text or json log lines.")
    ] = None,
    voters: Annotated[
        str | None,
        typer.Option("--voters", help="ID,ID,... the fixed voter set when there is no inventory."),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="The host's GPUs this node owns: auto, none or I,J,..."),
    ] = None,
    training_nproc: Annotated[
        str | None,
        typer.Option("--training-nproc", help="Training processes: auto or a count."),
    ] = None,
) -> None:
    """Run the node daemon in the foreground until SIGTERM or SIGINT."""
    # What the daemon creates (databases, node id, WAL, logs) is not world-readable, under
    # systemd (UMask=0027) or not.
    os.umask(DAEMON_UMASK)
    flags: dict[str, object] = {
        "inventory": inventory,
        "data_dir": data_dir,
        "node_id": node_id,
        "bind": bind,
        "port": port,
        "advertise_address": advertise,
        "seeds": tuple(seed) if seed else None,
        "mdns": False if no_mdns else None,
        "secret_file": secret_file,
        "insecure": True if insecure else None,
        "log_format": log_format,
        "voters": tuple(v.strip() for v in voters.split(",") if v.strip()) if voters else None,
        "gpus": gpus,
        "training_nproc": training_nproc,
    }
    settings = settings_from(config_file, flags).settings
    try:
        asyncio.run(_serve(settings))
    except ConfigError as exc:
        fail(exc.problems)
    except WalCorruptError as exc:
        fail(str(exc))
    except (NodeError, WalError, SyncError, OSError) as exc:
        known = startup_error(exc, settings.data_dir)
        if known is not None:
            fail(str(known), known.command_exit_code)
        fail(str(exc) or type(exc).__name__, EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Add `shoal serve` to the app."""
    app.command("serve")(serve)
