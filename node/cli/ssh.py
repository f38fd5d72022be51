"""`shoal ssh run|check|trust`: ask every inventory host over SSH at once."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from typer.core import TyperCommand

from config import Inventory, Role, eligible_hosts, load_inventory
from node.cli.common import config_errors, console, fail, print_json, settings_from
from node.errors import SSHError
from node.ssh.check import HostCheck, check_hosts
from node.ssh.executor import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_KNOWN_HOSTS,
    SSHExecutor,
    SSHResult,
)
from node.ssh.trust import TRUSTED, HostKeyInfo, add_host_key, fetch_host_key

REMOTE_COMMAND = "shoal.ssh.remote_command"
ssh_app = typer.Typer(help="Run commands on inventory hosts over SSH.", no_args_is_help=True)

InventoryOption = Annotated[
    Path | None,
    typer.Option("--inventory", help="Inventory file; default from config/$SHOAL_CLUSTER_CONFIG."),
]
KnownHostsOption = Annotated[
    Path | None,
    typer.Option("--known-hosts", help="known_hosts file; default setting ssh_known_hosts."),
]
AllOption = Annotated[bool, typer.Option("--all", help="Every host of the inventory.")]
RoleOption = Annotated[Role | None, typer.Option("--role", help="Ready hosts that take a role.")]
HostsArgument = Annotated[list[str] | None, typer.Argument(help="Inventory host names.")]


def load_targets(
    inventory_file: Path | None,
    known_hosts: Path | None,
    hosts: list[str] | None,
    all_hosts: bool,
    role: Role | None,
) -> tuple[Inventory, Path, list[str]]:
    """The inventory, the known_hosts file and the chosen host names (exits 2 on misuse)."""
    settings = settings_from().settings
    path = inventory_file or settings.inventory
    if path is None:
        fail("no inventory: pass --inventory FILE or set SHOAL_CLUSTER_CONFIG")
    with config_errors():
        inventory = load_inventory(path)
    known = known_hosts or settings.ssh_known_hosts or DEFAULT_KNOWN_HOSTS
    chosen = sum([bool(hosts), all_hosts, role is not None])
    if chosen != 1:
        fail("name the hosts: HOST ..., --all or --role ROLE (exactly one of them)")
    if all_hosts:
        names = sorted(inventory.hosts)
    elif role is not None:
        names = sorted(eligible_hosts(inventory, role=role))
    else:
        names = list(hosts or [])
        unknown = [h for h in names if h not in inventory.hosts]
        if unknown:
            fail(
                f"not in {path}: {', '.join(unknown)} (hosts: {', '.join(sorted(inventory.hosts))})"
            )
    if not names:
        fail("no host matches")
    return inventory, Path(known).expanduser(), names


class _CommandAfterDashes(TyperCommand):
    """Keeps what follows the first `--` as the remote command (ctx.meta[REMOTE_COMMAND])
    instead of letting the HOST arguments swallow it."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if "--" in args:
            cut = args.index("--")
            ctx.meta[REMOTE_COMMAND] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)


def executor_for(inventory: Inventory, known: Path) -> SSHExecutor:
    """An executor with the timeouts of the effective settings (ssh_connect_s)."""
    return SSHExecutor(inventory, known, timeouts=settings_from().settings.timeouts)


@ssh_app.command("run", cls=_CommandAfterDashes)
def ssh_run(
    ctx: typer.Context,
    hosts: HostsArgument = None,
    inventory_file: InventoryOption = None,
    all_hosts: AllOption = False,
    role: RoleOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Seconds per host for the command.")
    ] = DEFAULT_COMMAND_TIMEOUT_S,
    known_hosts: KnownHostsOption = None,
) -> None:
    """Run `-- COMMAND...` on the hosts at once; exit 0 only when every host exited 0."""
    command = list(ctx.meta.get(REMOTE_COMMAND, []))
    if not command:
        fail("no command: put it after --, e.g. shoal ssh run --all -- uname -a")
    inventory, known, names = load_targets(inventory_file, known_hosts, hosts, all_hosts, role)

    async def go() -> dict[str, SSHResult]:
        async with executor_for(inventory, known) as executor:
            return await executor.run_parallel(names, command, timeout_s)

    results = asyncio.run(go())
    ok = all(r.ok for r in results.values())
    if as_json:
        print_json({"results": {h: r.as_dict() for h, r in results.items()}})
    else:
        for host, result in results.items():
            status = result.error or f"exit {result.exit_code}"
            console.rule(f"{host}: {status} ({result.duration_s:.2f}s)", align="left")
            for text in (result.stdout, result.stderr):
                if text:
                    console.print(text.rstrip("\n"), markup=False, highlight=False)
    raise typer.Exit(0 if ok else 1)


@ssh_app.command("check")
def ssh_check(
    hosts: HostsArgument = None,
    inventory_file: InventoryOption = None,
    all_hosts: AllOption = False,
    role: RoleOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    known_hosts: KnownHostsOption = None,
) -> None:
    """Reachability, host key, python, free disk (at the host's path) and GPUs, per host."""
    inventory, known, names = load_targets(inventory_file, known_hosts, hosts, all_hosts, role)
    paths = {name: inventory.hosts[name].path for name in names}

    async def go() -> dict[str, HostCheck]:
        async with executor_for(inventory, known) as executor:
            return await check_hosts(executor, names, paths)

    rows = asyncio.run(go())
    ok = all(row.error is None for row in rows.values())
    if as_json:
        print_json({"hosts": {h: asdict(r) | {"host_key": r.host_key} for h, r in rows.items()}})
        raise typer.Exit(0 if ok else 1)
    table = Table(title=f"ssh check: {len(rows)} hosts")
    for column in ("host", "reachable", "host key", "python", "free disk", "gpus", "error"):
        table.add_column(column)
    for host, row in rows.items():
        memory = row.memory
        gpus = f"{memory.gpu_count} x {memory.gpu_memory_gb:g} GB" if memory else "-"
        table.add_row(
            host,
            "yes" if row.error is None else "no",
            row.host_key,
            row.python or "-",
            "-" if row.disk_free_gb is None else f"{row.disk_free_gb:g} GB",
            gpus if memory and memory.gpu_count else "none",
            row.error or "",
        )
    console.print(table)
    raise typer.Exit(0 if ok else 1)


@ssh_app.command("trust")
def ssh_trust(
    host: Annotated[str, typer.Argument(help="Inventory host name.")],
    inventory_file: InventoryOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Add the key to known_hosts.")] = False,
    known_hosts: KnownHostsOption = None,
) -> None:
    """Fetch HOST's key and print its fingerprint; with --yes, add it to known_hosts."""
    inventory, known, _ = load_targets(inventory_file, known_hosts, [host], False, None)

    async def go() -> HostKeyInfo:
        async with executor_for(inventory, known) as executor:
            endpoint = executor.endpoint(host)
            return await fetch_host_key(executor.pool, endpoint, executor.endpoints)

    try:
        info = asyncio.run(go())
    except SSHError as exc:
        fail(str(exc), 1)
    console.print(
        f"{host} ({info.pattern}): {info.fingerprint} [{info.status}]",
        markup=False,
        highlight=False,
    )
    if info.status == TRUSTED:
        console.print(f"already in {known}", highlight=False)
        return
    if not yes:
        console.print(
            f"not added: compare the fingerprint with the host's own "
            f"(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then run "
            f"`shoal ssh trust {host} --yes`",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(1)
    add_host_key(known, info)
    console.print(f"added to {known}", highlight=False)
