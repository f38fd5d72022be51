"""cluster_monitor: every node of a shoal cluster at a glance, live with --watch, or as JSON.

Exit status: 0 when every node is alive and healthy, 1 when any is degraded, unhealthy, dead or
unreachable, 2 on usage errors. `python -m health.cluster_monitor` runs the same program.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from health.monitor.client import DEFAULT_NODE_URL
from health.monitor.run import (
    DEFAULT_INTERVAL_S,
    PROG,
    MonitorOptions,
    UsageError,
    report_problems,
    run_monitor,
)

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
    parser.add_argument(
        "--node",
        dest="nodes",
        action="append",
        default=[],
        metavar="URL",
        help="a node's API (http://HOST:PORT); the rest of the cluster is learned from its "
        f"peers (repeatable; default: the local node from the config, else {DEFAULT_NODE_URL})",
    )
    parser.add_argument("--inventory", type=Path, metavar="F", help="ask every host listed")
    parser.add_argument(
        "--secret-file", type=Path, metavar="F", help="cluster secret (default from the config)"
    )
    parser.add_argument("--watch", action="store_true", help="refresh until q or Ctrl-C")
    parser.add_argument(
        "--interval", dest="interval_s", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
        help=f"seconds between refreshes with --watch (default {DEFAULT_INTERVAL_S:g})",
    )  # fmt: skip
    parser.add_argument(
        "--json", dest="as_json", action="store_true",
        help="print JSON (one document per line with --watch)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", dest="timeout_s", type=float, metavar="S",
        help="per-request timeout (default timeouts.peer_status_s, 3 s)",
    )  # fmt: skip
    return parser


def parse_args(argv: Sequence[str] | None = None) -> MonitorOptions:
    """Options from the command line; UsageError on a bad flag (--help exits 0 itself)."""
    args = _parser().parse_args(argv)
    return MonitorOptions(
        nodes=tuple(args.nodes),
        inventory=args.inventory,
        secret_file=args.secret_file,
        watch=args.watch,
        interval_s=args.interval_s,
        as_json=args.as_json,
        timeout_s=args.timeout_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `cluster_monitor` console script; returns the exit status."""
    try:
        options = parse_args(argv)
    except UsageError as exc:
        return report_problems([str(exc)], sys.stderr)
    return run_monitor(options)


if __name__ == "__main__":
    sys.exit(main())
