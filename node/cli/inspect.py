"""`shoal status`, `shoal peers` and `shoal roles`: what one node sees."""

from __future__ import annotations

from typing import Any

import typer

from config import NodeSettings
from node.cli import common
from node.cli.common import (
    ConfigOption,
    JsonOption,
    NodeOption,
    fetch_json,
    node_url,
    print_json,
    settings_from,
)


def _get_json(settings: NodeSettings, url: str, path: str) -> Any:
    return fetch_json(settings, url + path, timeout_s=settings.timeouts.peer_status_s)


def status(
    node: NodeOption = None, as_json: JsonOption = False, config_file: ConfigOption = None
) -> None:
    """Show the status of a node (default: the local one)."""
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    document = _get_json(settings, url, "/v1/status")
    if as_json:
        print_json(document)
        return
    from rich.table import Table  # here: --json needs no rich

    table = Table(show_header=False, title=f"{document['node_id']} at {url}")
    for key in ("cluster", "version", "address", "port", "role", "term", "coordinator", "health"):
        table.add_row(key, str(document.get(key)))
    members = document.get("members", {})
    table.add_row("members", ", ".join(f"{k} {v}" for k, v in members.items()))
    wal = document.get("wal", {})
    oldest = wal.get("oldest_pending_age_s")
    oldest_text = "-" if oldest is None else f"{oldest:.0f} s"
    pending = wal.get("pending")
    table.add_row("wal", f"{'-' if pending is None else pending} pending, oldest {oldest_text}")
    table.add_row("breakers open", ", ".join(document.get("breakers", {}).get("open", [])) or "-")
    table.add_row("uptime", f"{document.get('uptime_s', 0):.0f} s")
    common.console.print(table)


def peers(
    node: NodeOption = None, as_json: JsonOption = False, config_file: ConfigOption = None
) -> None:
    """Show a node's membership view: every member, its state and incarnation."""
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    document = _get_json(settings, url, "/v1/peers")
    if as_json:
        print_json(document)
        return
    from rich.table import Table  # here: --json needs no rich

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
    common.console.print(table)


def roles(
    node: NodeOption = None, as_json: JsonOption = False, config_file: ConfigOption = None
) -> None:
    """Print the role plan a node applies: term, version, generation, each node's role and
    training ranks (node-major: a node of N processes holds N consecutive ranks), and why a
    node cannot train."""
    settings = settings_from(config_file).settings
    url = node_url(settings, node)
    document = _get_json(settings, url, "/v1/plan")
    if as_json:
        print_json(document)
        return
    plan = document.get("plan")
    if not plan:
        common.console.print(
            f"no plan yet (term {document.get('term')}, coordinator {document.get('coordinator')})",
            highlight=False,
        )
        return
    from rich.table import Table  # here: --json needs no rich

    ranks = _global_ranks(plan["training_ranks"], plan.get("local_world_sizes"))
    group = plan["group"]
    unable = plan.get("cannot_train", {})
    table = Table(
        title=f"plan {plan['term']}.{plan['version']} by {document.get('coordinator')}: "
        f"generation {plan.get('generation')}, world {group['world_size']} at "
        f"{group['master_addr'] or '-'}:{group['master_port']} ({group['backend']})"
    )
    for column in ("node", "role", "ranks", "cannot train"):
        table.add_column(column)
    for node_id, role in sorted(plan["roles"].items()):
        table.add_row(node_id, role, str(ranks.get(node_id, "-")), unable.get(node_id, ""))
    common.console.print(table)
    if plan.get("note"):
        common.console.print(plan["note"], highlight=False)


def _global_ranks(nodes: list[str], sizes: list[int] | None) -> dict[str, str]:
    """Each training node's global ranks in a node-major group: `2` or `2-3`."""
    shown: dict[str, str] = {}
    offset = 0
    for node_id, size in zip(nodes, sizes or [1] * len(nodes), strict=False):
        shown[node_id] = str(offset) if size == 1 else f"{offset}-{offset + size - 1}"
        offset += size
    return shown


def register(app: typer.Typer) -> None:
    """Add the read-only inspection commands to the app."""
    app.command("status")(status)
    app.command("peers")(peers)
    app.command("roles")(roles)
