"""`shoal deploy` and `shoal undeploy`: put shoal on inventory hosts, or take it off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer

from config import Inventory, read_secret_file
from node.cli.common import JsonOption, config_errors, console, fail, print_json, settings_from
from node.cli.ssh import (
    AllOption,
    HostsArgument,
    InventoryOption,
    KnownHostsOption,
    RoleOption,
    executor_for,
    load_targets,
)
from node.ssh.cluster import HttpClusterProbe
from node.ssh.deploy import DeployResult, deploy, desired_for_hosts, undeploy_host
from node.ssh.plan import DEFAULT_CACHE_DIR, FAILED, HEALTH_TIMEOUT_S
from node.ssh.rolling import SETTLE_TIMEOUT_S, RollingReport, report_lines, rolling_upgrade
from node.ssh.upgrader import SshUpgrader

if TYPE_CHECKING:
    from node.ssh.executor import SSHExecutor

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print every step per host; change nothing.")
]


def _report(results: dict[str, DeployResult], as_json: bool) -> None:
    if as_json:
        print_json({"results": {h: r.as_dict() for h, r in results.items()}})
    else:
        for result in results.values():
            console.print(result.line(), markup=False, highlight=False)
            if result.dry_run:
                for step in result.steps:
                    console.print(f"  - {step}", markup=False, highlight=False)
    raise typer.Exit(1 if any(r.status == FAILED for r in results.values()) else 0)


def _report_rolling(report: RollingReport, as_json: bool) -> None:
    if as_json:
        print_json(report.as_dict())
    else:
        for line in report_lines(report):
            console.print(line, markup=False, highlight=False)
    raise typer.Exit(0 if report.ok else 1)


def _progress(as_json: bool) -> Callable[[str], None]:
    def show(line: str) -> None:
        typer.echo(line, err=as_json)

    return show


def deploy_command(
    hosts: HostsArgument = None,
    inventory_file: InventoryOption = None,
    all_hosts: AllOption = False,
    role: RoleOption = None,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="Push wheels of every dependency too (repacked from this environment; the "
            "hosts need the same Python version and platform) and install without an index.",
        ),
    ] = False,
    python: Annotated[
        str, typer.Option("--python", help="Python on the hosts that creates the venv.")
    ] = "python3",
    secret_file: Annotated[
        Path | None,
        typer.Option("--secret-file", help="Cluster secret to install; default secret_file."),
    ] = None,
    cache_dir: Annotated[
        Path, typer.Option("--cache-dir", help="Where built wheels are kept and reused.")
    ] = DEFAULT_CACHE_DIR,
    health_timeout_s: Annotated[
        float, typer.Option("--health-timeout", help="Seconds to wait for /v1/health.")
    ] = HEALTH_TIMEOUT_S,
    known_hosts: KnownHostsOption = None,
    rolling: Annotated[
        bool,
        typer.Option(
            "--rolling",
            help="One host at a time, voters last, never below a majority of voters alive; "
            "wait for each host to rejoin before the next; stop at the first that does not.",
        ),
    ] = False,
    settle_timeout_s: Annotated[
        float,
        typer.Option(
            "--settle-timeout",
            help="With --rolling: seconds for a host to be alive at a majority of members "
            "with an agreed coordinator.",
        ),
    ] = SETTLE_TIMEOUT_S,
    ca_dir: Annotated[
        Path | None,
        typer.Option(
            "--ca",
            help="The operator's CA dir (shoal ca init): issue each host a node certificate "
            "(kept while still good) and push it with ca.crt and crl.pem; adds tls: to the "
            "node config.",
        ),
    ] = None,
) -> None:
    """Install (or upgrade) and start shoal on the hosts; `unchanged` when already there.

    Every host at once; with --rolling one at a time, each back in before the next."""
    inventory, known, names = load_targets(inventory_file, known_hosts, hosts, all_hosts, role)
    secret_path = secret_file or settings_from().settings.secret_file
    if secret_path is None:
        fail("deploy installs the cluster secret: pass --secret-file or set secret_file")
    with config_errors():
        secret = read_secret_file(secret_path, "cluster secret")
    if inventory.source is None:
        fail("the inventory must come from a file to be pushed to the hosts")
    if ca_dir is not None and not (ca_dir / "ca.crt").is_file():
        fail(f"--ca {ca_dir}: no ca.crt there; make a CA with `shoal ca init --dir {ca_dir}`")
    install = _Install(
        secret=secret, inventory_text=inventory.source.read_text(), python=python,
        offline=offline, cache_dir=cache_dir,
    )  # fmt: skip
    run = _DeployRun(inventory, known, names, install, health_timeout_s, ca_dir, dry_run)
    if rolling:
        _report_rolling(asyncio.run(run.rolling(settle_timeout_s, as_json)), as_json)
    _report(asyncio.run(run.all_at_once()), as_json)


class _Install(TypedDict):
    """What a deploy installs on each host, as desired_for_hosts and deploy take it."""

    secret: bytes
    inventory_text: str
    python: str
    offline: bool
    cache_dir: Path


@dataclass(frozen=True)
class _DeployRun:
    """One `shoal deploy`: its hosts and what it installs there."""

    inventory: Inventory
    known: Path
    names: list[str]
    install: _Install
    health_timeout_s: float
    ca_dir: Path | None
    dry_run: bool

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[tuple[SSHExecutor, HttpClusterProbe]]:
        """An SSH executor for the hosts and the probe that asks (and records in) the
        cluster."""
        async with (
            executor_for(self.inventory, self.known) as executor,
            HttpClusterProbe(self.inventory, self.install["secret"]) as probe,
        ):
            yield executor, probe

    async def rolling(self, settle_timeout_s: float, as_json: bool) -> RollingReport:
        """One host at a time (node.ssh.rolling)."""
        async with self._session() as (executor, probe):
            desired, early = await desired_for_hosts(
                executor, self.names, tls=self.ca_dir is not None, **self.install
            )
            upgrader = SshUpgrader(
                executor,
                desired,
                early,
                health_timeout_s=self.health_timeout_s,
                ca_dir=self.ca_dir,
                recorder=probe,
            )
            return await rolling_upgrade(
                self.names,
                members=sorted(self.inventory.hosts),
                voters=self.inventory.voters,
                upgrader=upgrader,
                probe=probe,
                dry_run=self.dry_run,
                settle_timeout_s=settle_timeout_s,
                progress=_progress(as_json),
            )

    async def all_at_once(self) -> dict[str, DeployResult]:
        """Every host at once."""
        async with self._session() as (executor, recorder):
            return await deploy(
                executor,
                self.names,
                dry_run=self.dry_run,
                health_timeout_s=self.health_timeout_s,
                ca_dir=self.ca_dir,
                recorder=recorder,
                **self.install,
            )


def undeploy_command(
    hosts: Annotated[list[str], typer.Argument(help="Inventory host names.")],
    inventory_file: InventoryOption = None,
    purge: Annotated[
        bool, typer.Option("--purge", help="Remove the data dir too (everything under path).")
    ] = False,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
    known_hosts: KnownHostsOption = None,
) -> None:
    """Stop and remove shoal on the hosts; the data dir stays unless --purge."""
    inventory, known, names = load_targets(inventory_file, known_hosts, hosts, False, None)

    async def go() -> dict[str, DeployResult]:
        async with executor_for(inventory, known) as executor:
            done = await asyncio.gather(
                *(undeploy_host(executor, h, purge=purge, dry_run=dry_run) for h in names)
            )
        return dict(zip(names, done, strict=True))

    _report(asyncio.run(go()), as_json)


def register(app: typer.Typer) -> None:
    """Add `deploy` and `undeploy` to the `shoal` app."""
    app.command("deploy")(deploy_command)
    app.command("undeploy")(undeploy_command)
