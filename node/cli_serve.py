"""`shoal serve`, `shoal status`, `shoal peers` and `shoal dev-cluster`."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from config import ConfigError, LogFormat, NodeSettings
from node.cli_common import (
    EXIT_FAILURE,
    console,
    fail,
    node_url,
    print_json,
    request_json,
    settings_from,
)
from node.daemon import NodeDaemon
from node.errors import NodeError
from node.logs import configure_logging
from wal import WalCorruptError, WalError

log = logging.getLogger(__name__)

NodeOption = Annotated[
    str | None, typer.Option("--node", help="Daemon URL; default the local node from the config.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="Config file (YAML); default $SHOAL_CONFIG.")
]


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
        await stop.wait()
        log.info("stopping: leaving the cluster and closing the WAL")
    finally:
        await asyncio.wait_for(daemon.close(), settings.timeouts.shutdown_s)


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
) -> None:
    """Run the node daemon in the foreground until SIGTERM or SIGINT."""
    flags: dict[str, Any] = {
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
    }
    settings = settings_from(config_file, flags).settings
    try:
        asyncio.run(_serve(settings))
    except ConfigError as exc:
        fail(exc.problems)
    except WalCorruptError as exc:
        fail(str(exc))
    except (NodeError, WalError) as exc:
        fail(str(exc), EXIT_FAILURE)


async def _get_json(settings: NodeSettings, url: str, path: str) -> Any:
    return await request_json(
        settings, "GET", url + path, timeout_s=settings.timeouts.peer_status_s
    )


def status(
    node: NodeOption = None, as_json: JsonOption = False, config_file: ConfigOption = None
) -> None:
    """Show the status of a node (default: the local one)."""
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    document = asyncio.run(_get_json(settings, url, "/v1/status"))
    if as_json:
        print_json(document)
        return
    table = Table(show_header=False, title=f"{document['node_id']} at {url}")
    for key in ("cluster", "version", "address", "port", "role", "term", "coordinator", "health"):
        table.add_row(key, str(document.get(key)))
    members = document.get("members", {})
    table.add_row("members", ", ".join(f"{k} {v}" for k, v in members.items()))
    wal = document.get("wal", {})
    table.add_row(
        "wal", f"{wal.get('pending')} pending, oldest {wal.get('oldest_pending_age_s')} s"
    )
    table.add_row("breakers open", ", ".join(document.get("breakers", {}).get("open", [])) or "-")
    table.add_row("uptime", f"{document.get('uptime_s', 0):.0f} s")
    console.print(table)


def peers(
    node: NodeOption = None, as_json: JsonOption = False, config_file: ConfigOption = None
) -> None:
    """Show a node's membership view: every member, its state and incarnation."""
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    document = asyncio.run(_get_json(settings, url, "/v1/peers"))
    if as_json:
        print_json(document)
        return
    table = Table(title=f"members seen by {url}")
    for column in ("node", "address", "state", "incarnation", "last seen", "role", "version"):
        table.add_column(column)
    for member in document.get("members", []):
        table.add_row(
            member["node_id"] + (" (self)" if member.get("is_self") else ""),
            f"{member['address']}:{member['port']}",
            member["state"],
            str(member["incarnation"]),
            f"{member['last_seen_s']:.1f} s",
            str(member.get("role")),
            str(member.get("version")),
        )
    console.print(table)


def roles(
    node: NodeOption = None, as_json: JsonOption = False, config_file: ConfigOption = None
) -> None:
    """Print the role plan a node applies: term, version, each node's role, training ranks."""
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    document = asyncio.run(_get_json(settings, url, "/v1/plan"))
    if as_json:
        print_json(document)
        return
    plan = document.get("plan")
    if not plan:
        console.print(
            f"no plan yet (term {document.get('term')}, coordinator {document.get('coordinator')})",
            highlight=False,
        )
        return
    ranks = {node_id: rank for rank, node_id in enumerate(plan["training_ranks"])}
    rendezvous = plan["rendezvous"]
    table = Table(
        title=f"plan {plan['term']}.{plan['version']} by {document.get('coordinator')}: "
        f"world {rendezvous['world_size']} at {rendezvous['master_addr'] or '-'}:"
        f"{rendezvous['master_port']} ({rendezvous['backend']})"
    )
    for column in ("node", "role", "rank"):
        table.add_column(column)
    for node_id, role in sorted(plan["roles"].items()):
        table.add_row(node_id, role, str(ranks.get(node_id, "-")))
    console.print(table)
    if plan.get("note"):
        console.print(plan["note"], highlight=False)


def dev_inventory(nodes: int, base_port: int) -> str:
    """The inventory `shoal dev-cluster` writes for its loopback nodes."""
    lines = ["cluster: {name: dev}", "hosts:"]
    for index in range(1, nodes + 1):
        lines.append(f"  dev-{index}: {{ssh_host: 127.0.0.1, p2p_port: {base_port + index - 1}}}")
    return "\n".join(lines) + "\n"


def dev_cluster(
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=64, help="How many nodes.")] = 3,
    base_port: Annotated[int, typer.Option("--base-port", help="Port of the first node.")] = 8770,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Parent of every node's data dir.")
    ] = Path(".shoal/dev"),
) -> None:
    """Start N nodes on 127.0.0.1 (own ports and data dirs); Ctrl-C stops them all."""
    data_dir.mkdir(parents=True, exist_ok=True)
    inventory = data_dir / "hosts.yaml"
    inventory.write_text(dev_inventory(nodes, base_port), encoding="utf-8")
    processes: list[subprocess.Popen[bytes]] = []

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        for index in range(1, nodes + 1):
            command = [
                sys.executable, "-m", "node", "serve",
                "--node-id", f"dev-{index}",
                "--port", str(base_port + index - 1),
                "--data-dir", str(data_dir / f"dev-{index}"),
                "--inventory", str(inventory),
            ]  # fmt: skip
            log_file = open(data_dir / f"dev-{index}.log", "ab")  # noqa: SIM115 - child owns it
            processes.append(
                subprocess.Popen(command, stdout=log_file, stderr=log_file)  # noqa: S603
            )
            log_file.close()
        for index in range(nodes):
            console.print(
                f"dev-{index + 1}: http://127.0.0.1:{base_port + index}  "
                f"(log {data_dir / f'dev-{index + 1}.log'})",
                highlight=False,
            )
        console.print("press Ctrl-C to stop every node", highlight=False)
        while all(process.poll() is None for process in processes):
            time.sleep(0.5)
        dead = [f"dev-{i + 1}" for i, p in enumerate(processes) if p.poll() is not None]
        fail(f"node(s) {', '.join(dead)} exited; see their logs in {data_dir}", EXIT_FAILURE)
    except KeyboardInterrupt:
        console.print("stopping...", highlight=False)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=12)
            except subprocess.TimeoutExpired:
                process.kill()


def register(app: typer.Typer) -> None:
    """Add the daemon commands to the `shoal` app."""
    app.command("serve")(serve)
    app.command("status")(status)
    app.command("peers")(peers)
    app.command("roles")(roles)
    app.command("dev-cluster")(dev_cluster)
