"""The `shoal` command line: one typer app whose commands are imported only when they run.

COMMANDS names every command, the module and attribute that define it, and the line `shoal
--help` lists for it, so `shoal --help` and `shoal --version` import no command's module and
`shoal status` imports `node.cli.inspect` alone. tests/node/test_cli_start.py checks that each
listed line is the command's own help and that the help reads as it did when every module was
imported up front.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any

import typer
import typer.main
from typer import _click  # typer vendors click: the Command and Context types typer builds
from typer.core import TyperCommand, TyperGroup

from config.version import shoal_version

__all__ = ["COMMANDS", "CommandEntry", "app", "eager_app", "main"]

HELP = "shoal: peer-to-peer node service for GPU clusters."


@dataclass(frozen=True)
class CommandEntry:
    """One command of `shoal`: `attribute` of `module` is its typer.Typer (a command group) or
    a `register(app)` that adds it; `help` is the line `shoal --help` lists (the first paragraph
    of the command's own help)."""

    name: str
    module: str
    attribute: str
    help: str

    def add_to(self, app: typer.Typer) -> None:
        """Add the command to `app` the way its module defines it (importing that module)."""
        target = getattr(importlib.import_module(self.module), self.attribute)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=self.name)
        else:
            target(app)

    def load(self) -> _click.Command:
        """The command as typer builds it from its module."""
        scratch = typer.Typer(add_completion=False)
        self.add_to(scratch)
        return typer.main.get_group(scratch).commands[self.name]


# In the order `shoal --help` lists them: single commands first, then command groups.
COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry(
        "serve", "node.cli.serve", "register",
        "Run the node daemon in the foreground until SIGTERM or SIGINT.",
    ),
    CommandEntry(
        "status", "node.cli.inspect", "register",
        "Show the status of a node (default: the local one).",
    ),
    CommandEntry(
        "peers", "node.cli.inspect", "register",
        "Show a node's membership view: every member, its state and incarnation.",
    ),
    CommandEntry(
        "roles", "node.cli.inspect", "register",
        "Print the role plan a node applies: term, version, generation, each node's role and\n"
        "training ranks (node-major: a node of N processes holds N consecutive ranks), and why a\n"
        "node cannot train.",
    ),
    CommandEntry(
        "training", "node.cli.training", "register",
        "Show the training group from any node: every rank's step, steps/s, compute time and\n"
        "straggler flag, whether the group is hung, its restarts with their reasons, and the\n"
        "training nodes that did not answer in time.",
    ),
    CommandEntry(
        "monitor", "node.cli.monitor", "register",
        "Every node of the cluster at a glance; exit 0 when all are alive and healthy, else 1.",
    ),
    CommandEntry(
        "sync", "node.cli.sync", "register",
        "Ask the daemon to sync now and wait until it is done; exit 1 if any transfer failed.",
    ),
    CommandEntry(
        "deploy", "node.cli.deploy", "register",
        "Install (or upgrade) and start shoal on the hosts; `unchanged` when already there.",
    ),
    CommandEntry(
        "undeploy", "node.cli.deploy", "register",
        "Stop and remove shoal on the hosts; the data dir stays unless --purge.",
    ),
    CommandEntry("version", "node.cli.app", "register_version", "Print the shoal version."),
    CommandEntry(
        "backup", "node.cli.backup", "register",
        "Take a consistent backup of a running node (it keeps serving) into one archive.",
    ),
    CommandEntry(
        "restore", "node.cli.backup", "register",
        "Verify every member of a backup archive, then restore it into a data dir.",
    ),
    CommandEntry(
        "audit", "node.cli.audit", "register",
        "List who did what, on which node and when: job starts and kills, gang starts, lock\n"
        "grants and releases, run steps, deploys, gossip keyring changes, drains, undrains,\n"
        "leaves, GPU quarantines and re-admissions, restarts of the training group (certificate\n"
        "lists nothing yet).",
    ),
    CommandEntry(
        "hosts", "node.cli.hosts", "hosts_app", "Check and list the YAML host inventory."
    ),
    CommandEntry("config", "node.cli.hosts", "config_app", "Show the effective configuration."),
    CommandEntry("wal", "node.cli.wal", "wal_app", "Inspect and maintain the write-ahead log."),
    CommandEntry(
        "records", "node.cli.records", "records_app",
        "Record stores (games, rollouts) of a node: status, import, export.",
    ),
    CommandEntry(
        "jobs", "node.cli.jobs", "jobs_app",
        "Jobs: run a command on a node or a gang of nodes, follow its logs, wait, kill, fetch.",
    ),
    CommandEntry(
        "runs", "node.cli.runs", "runs_app",
        "Runs: queue a training run per concurrency group; results go to the results store.",
    ),
    CommandEntry(
        "node", "node.cli.nodes", "node_app",
        "Nodes: drain one (no new work goes there), undrain it, or make it leave the cluster.",
    ),
    CommandEntry("ssh", "node.cli.ssh", "ssh_app", "Run commands on inventory hosts over SSH."),
    CommandEntry(
        "workers", "node.cli.workers", "workers_app",
        "Miniray-style workers: a server that forks one worker per authenticated connection.",
    ),
    CommandEntry(
        "ca", "node.cli.ca", "ca_app",
        "The cluster CA: issue, revoke and list node, operator and reader certificates.",
    ),
    CommandEntry(
        "keyring", "node.cli.keyring", "keyring_app",
        "The gossip keyring: keys that encrypt membership datagrams, rotated live.",
    ),
    CommandEntry(
        "dev-cluster", "node.cli.devcluster", "register",
        "A local cluster on 127.0.0.1 to try shoal and its failures: start it, then kill and "
        "restart single nodes from another terminal while cluster_monitor watches.",
    ),
    CommandEntry(
        "rl", "node.cli.rl", "register",
        "Pipeline RL: in-flight weight updates, stamped rollouts, bounded lag.",
    ),
)  # fmt: skip


class DeferredCommand(TyperCommand):
    """A command of COMMANDS as `shoal --help` lists it (its name and help line); running it,
    or asking its own help, imports its module and hands over to the command typer builds."""

    def __init__(self, entry: CommandEntry) -> None:
        super().__init__(entry.name, help=entry.help)
        self.entry = entry
        self._loaded: _click.Command | None = None

    def loaded(self) -> _click.Command:
        """The real command (its module imported on the first call)."""
        if self._loaded is None:
            self._loaded = self.entry.load()
        return self._loaded

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: _click.Context | None = None,
        **extra: Any,
    ) -> _click.Context:
        return self.loaded().make_context(info_name, args, parent=parent, **extra)


class ShoalGroup(TyperGroup):
    """The root group: every command of COMMANDS, each deferred until it runs."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for entry in COMMANDS:
            self.commands.setdefault(entry.name, DeferredCommand(entry))


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"shoal {shoal_version()}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the shoal version and exit.",
        ),
    ] = False,
) -> None:
    """The options of `shoal` itself, before any command."""


def version() -> None:
    """Print the shoal version."""
    typer.echo(f"shoal {shoal_version()}")


def register_version(app: typer.Typer) -> None:
    """Add `shoal version` to the app."""
    app.command("version")(version)


def _new_app(group: type[TyperGroup]) -> typer.Typer:
    shoal = typer.Typer(
        name="shoal",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        cls=group,
    )
    shoal.callback()(_root)
    return shoal


app = _new_app(ShoalGroup)


def eager_app() -> typer.Typer:
    """The same command line with every command's module imported up front (how `shoal` was
    built before its commands were deferred); tests compare the two."""
    shoal = _new_app(TyperGroup)
    added: set[tuple[str, str]] = set()
    for entry in COMMANDS:
        if (entry.module, entry.attribute) not in added:  # one register() may add several
            added.add((entry.module, entry.attribute))
            entry.add_to(shoal)
    return shoal


def main() -> None:
    """Entry point of the `shoal` console script."""
    app()
