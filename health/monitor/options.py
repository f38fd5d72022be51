"""The options of cluster_monitor, defined once: MonitorOptions and the table of flags from
which both command lines are built (argparse for `cluster_monitor`, typer for `shoal monitor`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from health.monitor.client import DEFAULT_NODE_URL

__all__ = [
    "DEFAULT_INTERVAL_S",
    "MONITOR_FLAGS",
    "MonitorFlag",
    "MonitorOptions",
    "options_from",
]

DEFAULT_INTERVAL_S = 2.0


@dataclass(frozen=True)
class MonitorOptions:
    """The command line of cluster_monitor (and `shoal monitor`), as given."""

    nodes: tuple[str, ...] = ()
    inventory: Path | None = None
    secret_file: Path | None = None
    watch: bool = False
    once: bool = False
    interval_s: float = DEFAULT_INTERVAL_S
    as_json: bool = False
    timeout_s: float | None = None


@dataclass(frozen=True)
class MonitorFlag:
    """One flag: the MonitorOptions field it sets, its value type (bool: a switch), and its
    help. A `repeatable` flag collects its values into a tuple."""

    field: str
    flag: str
    kind: type[str] | type[Path] | type[float] | type[bool]
    help: str
    metavar: str | None = None
    repeatable: bool = False

    @property
    def default(self) -> Any:
        """The MonitorOptions default of the field (a repeatable flag's is empty)."""
        return _DEFAULTS[self.field]


_DEFAULTS = {field.name: field.default for field in dataclasses.fields(MonitorOptions)}

MONITOR_FLAGS: tuple[MonitorFlag, ...] = (
    MonitorFlag(
        "nodes", "--node", str, metavar="URL", repeatable=True,
        help="a node's API (http://HOST:PORT); the rest of the cluster is learned from its peers "
        f"(repeatable; default: the local node from the config, else {DEFAULT_NODE_URL})",
    ),
    MonitorFlag("inventory", "--inventory", Path, metavar="F", help="ask every host listed"),
    MonitorFlag(
        "secret_file", "--secret-file", Path, metavar="F",
        help="cluster secret (default from the config)",
    ),
    MonitorFlag("watch", "--watch", bool, help="refresh until q or Ctrl-C"),
    MonitorFlag(
        "once", "--once", bool,
        help="one status, then exit (what runs without --watch; for scripts to say so)",
    ),
    MonitorFlag(
        "interval_s", "--interval", float, metavar="S",
        help=f"seconds between refreshes with --watch (default {DEFAULT_INTERVAL_S:g})",
    ),
    MonitorFlag("as_json", "--json", bool, help="print JSON (one document per line with --watch)"),
    MonitorFlag(
        "timeout_s", "--timeout", float, metavar="S",
        help="per-request timeout (default timeouts.peer_status_s, 3 s)",
    ),
)  # fmt: skip


def options_from(values: Mapping[str, Any]) -> MonitorOptions:
    """MonitorOptions from parsed flag values keyed by field (None or absent: the default)."""
    given: dict[str, Any] = {}
    for flag in MONITOR_FLAGS:
        value = values.get(flag.field)
        if value is None:
            continue
        given[flag.field] = tuple(value) if flag.repeatable else value
    return MonitorOptions(**given)
