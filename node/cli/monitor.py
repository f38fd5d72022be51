"""`shoal monitor`: the cluster_monitor dashboard as a shoal command (same options, same exits).

Its options are built from health's MONITOR_FLAGS, the table cluster_monitor's parser is built
from too, so the two command lines cannot drift apart.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from health import MONITOR_FLAGS, MonitorFlag, options_from, run_monitor


def _parameter(flag: MonitorFlag) -> inspect.Parameter:
    """The typer parameter of one flag: a switch, a repeatable list, or an optional value."""
    help_text = flag.help[:1].upper() + flag.help[1:] + "."
    option = typer.Option(flag.flag, metavar=flag.metavar, help=help_text, show_default=False)
    annotation: Any
    default: Any = flag.default
    if flag.kind is bool:
        annotation = bool
    elif flag.repeatable:
        annotation, default = list[flag.kind] | None, None  # type: ignore[name-defined]
    elif default is None:
        annotation = flag.kind | None
    else:
        annotation = flag.kind
    return inspect.Parameter(
        flag.field,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[annotation, option],
        default=default,
    )


def monitor(**values: Any) -> None:
    """Every node of the cluster at a glance; exit 0 when all are alive and healthy, else 1."""
    raise typer.Exit(run_monitor(options_from(values)))


monitor.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [_parameter(flag) for flag in MONITOR_FLAGS], return_annotation=None
)


def register(app: typer.Typer) -> None:
    """Add `shoal monitor` to the `shoal` app."""
    app.command("monitor")(monitor)
