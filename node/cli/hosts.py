"""`shoal hosts ...` and `shoal config show`: the inventory and the effective settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from config import Inventory, Role, describe_settings, eligible_hosts, load_inventory
from node.cli.common import (
    ConfigOption,
    config_errors,
    console,
    fail,
    print_json,
    settings_from,
)

hosts_app = typer.Typer(help="Check and list the YAML host inventory.", no_args_is_help=True)
config_app = typer.Typer(help="Show the effective configuration.", no_args_is_help=True)


def _hosts_rows(inventory: Inventory, names: list[str]) -> list[dict[str, object]]:
    voters = set(inventory.voters)
    rows = []
    for name in names:
        host = inventory.hosts[name]
        rows.append(
            {
                "node_id": name,
                "address": host.address,
                "p2p_port": host.p2p_port,
                "ssh": f"{host.ssh_user + '@' if host.ssh_user else ''}{host.ssh_host or '-'}"
                f":{host.ssh_port}",
                "gpu": host.gpu,
                "gpu_count": host.gpu_count,
                "gpu_vram_gb": host.gpu_vram_gb,
                "role": host.role.value,
                "status": host.status.value,
                "voter": name in voters,
                "labels": dict(host.labels),
            }
        )
    return rows


def _print_hosts(inventory: Inventory, names: list[str]) -> None:
    table = Table(title=f"cluster {inventory.cluster.name}: {len(names)} hosts")
    for column in ("node", "address", "ssh", "gpu", "vram", "role", "status", "voter"):
        table.add_column(column)
    for row in _hosts_rows(inventory, names):
        gpu = f"{row['gpu_count']}x {row['gpu']}" if row["gpu"] else "-"
        table.add_row(
            str(row["node_id"]),
            f"{row['address']}:{row['p2p_port']}",
            str(row["ssh"]),
            gpu,
            f"{row['gpu_vram_gb']:g} GB",
            str(row["role"]),
            str(row["status"]),
            "yes" if row["voter"] else "",
        )
    console.print(table)


@hosts_app.command("check")
def hosts_check(
    file: Annotated[Path, typer.Argument(help="Inventory YAML file to validate.")],
) -> None:
    """Validate an inventory: exit 0 and a table of hosts, or exit 2 and every error."""
    with config_errors():
        inventory = load_inventory(file)
    _print_hosts(inventory, sorted(inventory.hosts))
    console.print(f"{file}: ok, {len(inventory.voters)} voters: {', '.join(inventory.voters)}")


@hosts_app.command("list")
def hosts_list(
    inventory_file: Annotated[
        Path | None,
        typer.Option(
            "--inventory", help="Inventory file; default from config/$SHOAL_CLUSTER_CONFIG."
        ),
    ] = None,
    role: Annotated[
        Role | None, typer.Option("--role", help="Only ready hosts that can take this role.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    config_file: ConfigOption = None,
) -> None:
    """List the inventory's hosts, optionally only those eligible for a role."""
    path = inventory_file or settings_from(config_file).settings.inventory
    if path is None:
        fail("no inventory: pass --inventory FILE or set SHOAL_CLUSTER_CONFIG")
    with config_errors():
        inventory = load_inventory(path)
    names = sorted(eligible_hosts(inventory, role=role)) if role else sorted(inventory.hosts)
    if as_json:
        print_json({"cluster": inventory.cluster.name, "hosts": _hosts_rows(inventory, names)})
    else:
        _print_hosts(inventory, names)


@config_app.command("show")
def config_show(
    config_file: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Print every effective setting and where it came from (default, file:line, env, flag)."""
    loaded = settings_from(config_file)
    rows = describe_settings(loaded)
    if as_json:
        print_json(
            {
                "config_file": str(loaded.config_file) if loaded.config_file else None,
                "settings": {name: {"value": value, "source": src} for name, value, src in rows},
            }
        )
        return
    table = Table(title=f"effective settings (config file: {loaded.config_file or 'none'})")
    table.add_column("setting")
    table.add_column("value")
    table.add_column("source")
    for name, value, source in rows:
        table.add_row(name, str(value), source)
    console.print(table)
