"""cluster_monitor: every node of a shoal cluster at a glance, live with --watch, or as JSON.

Exit status: 0 when every node is alive and healthy, 1 when any is degraded, unhealthy, dead or
unreachable, 2 on usage errors. `python -m health.cluster_monitor` runs the same program.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from health.errors import UsageError
from health.monitor.options import MONITOR_FLAGS, MonitorOptions, options_from
from health.monitor.run import PROG, report_problems, run_monitor

__all__ = ["main", "parse_args"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {PROG} --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Every node of a shoal cluster at a glance: state, health, GPUs, WAL backlog, "
        "breakers, version drift. Exit 0 when every node is alive and healthy, 1 when any is "
        "not, 2 on usage errors.",
    )
    for flag in MONITOR_FLAGS:
        if flag.kind is bool:
            parser.add_argument(flag.flag, dest=flag.field, action="store_true", help=flag.help)
        else:
            parser.add_argument(
                flag.flag,
                dest=flag.field,
                type=flag.kind,
                action="append" if flag.repeatable else "store",
                metavar=flag.metavar,
                help=flag.help,
            )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> MonitorOptions:
    """Options from the command line; UsageError on a bad flag (--help exits 0 itself)."""
    return options_from(vars(_parser().parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `cluster_monitor` console script; returns the exit status."""
    try:
        options = parse_args(argv)
    except UsageError as exc:
        return report_problems([str(exc)], sys.stderr)
    return run_monitor(options)


if __name__ == "__main__":
    sys.exit(main())
