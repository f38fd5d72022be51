"""Running cluster_monitor: options resolved against the node settings (node URLs, inventory,
secret, timeouts), then one status or --watch; returns the exit status (0, 1 or 2).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from config import ConfigError, load_settings, read_secret_file
from health.errors import MonitorError, UsageError
from health.monitor.client import ClusterMonitor, normalize_node_url
from health.monitor.model import ClusterStatus
from health.monitor.options import MonitorOptions
from health.monitor.terminal import print_status, watch_statuses
from net import local_url

if TYPE_CHECKING:
    from config import Inventory

__all__ = [
    "EXIT_FAILING",
    "EXIT_OK",
    "EXIT_USAGE",
    "MonitorPlan",
    "UsageError",
    "plan_monitor",
    "report_problems",
    "run_monitor",
]

PROG = "cluster_monitor"
EXIT_OK = 0
EXIT_FAILING = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
ONCE_THREADS = 64
"""One status (no --watch) asks over urllib in this many threads: no aiohttp to import."""


@dataclass(frozen=True)
class MonitorPlan:
    """What the options resolve to: node URLs, the inventory and secret read, the timeouts."""

    nodes: tuple[str, ...]
    inventory: Inventory | None
    secret: bytes | None
    timeout_s: float
    probe_interval_s: float


def plan_monitor(options: MonitorOptions) -> MonitorPlan:
    """Resolve options against the node settings (config file, environment): node URLs, the
    inventory and secret read, the timeouts. UsageError or ConfigError (exit status 2)."""
    if options.once and options.watch:
        raise UsageError("--once and --watch exclude each other: pick one")
    if options.interval_s <= 0:
        raise UsageError(f"--interval must be positive, got {options.interval_s:g}")
    if options.timeout_s is not None and options.timeout_s <= 0:
        raise UsageError(f"--timeout must be positive, got {options.timeout_s:g}")
    settings = load_settings().settings
    try:
        nodes = tuple(normalize_node_url(url) for url in options.nodes)
    except MonitorError as exc:
        raise UsageError(f"--node: {exc}") from exc
    inventory = None
    if options.inventory is not None:
        from config import load_inventory  # here: without --inventory, no inventory models

        inventory = load_inventory(options.inventory)
    if not nodes and inventory is None:
        nodes = (_local_url(settings.bind, settings.port),)
    secret_file = options.secret_file or settings.secret_file
    return MonitorPlan(
        nodes=nodes,
        inventory=inventory,
        secret=read_secret_file(secret_file) if secret_file is not None else None,
        timeout_s=options.timeout_s or settings.timeouts.peer_status_s,
        probe_interval_s=settings.timeouts.probe_interval_s,
    )


def _local_url(bind: str, port: int) -> str:
    return local_url(bind, port)


async def _once(plan: MonitorPlan, as_json: bool, out: TextIO) -> ClusterStatus:
    async with _monitor(plan, threads=ONCE_THREADS) as monitor:
        status = await monitor.get_cluster_status()
    print_status(status, out, as_json=as_json, probe_interval_s=plan.probe_interval_s)
    return status


async def _watch(plan: MonitorPlan, options: MonitorOptions, out: TextIO, keys: TextIO) -> None:
    async with _monitor(plan) as monitor:
        await watch_statuses(
            monitor.watch(options.interval_s),
            interval_s=options.interval_s,
            probe_interval_s=plan.probe_interval_s,
            as_json=options.as_json,
            out=out,
            keys=keys,
        )


def _monitor(plan: MonitorPlan, threads: int | None = None) -> ClusterMonitor:
    return ClusterMonitor(
        nodes=plan.nodes,
        inventory=plan.inventory,
        secret=plan.secret,
        timeout_s=plan.timeout_s,
        threads=threads,
    )


def report_problems(problems: Sequence[str], err: TextIO) -> int:
    """Each problem as one `cluster_monitor: error: ...` line on `err`; returns 2."""
    for line in problems:
        err.write(f"{PROG}: error: {line}\n")
    err.flush()
    return EXIT_USAGE


def run_monitor(
    options: MonitorOptions,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    keys: TextIO | None = None,
) -> int:
    """Run cluster_monitor with `options`; returns the exit status (0, 1, or 2)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        plan = plan_monitor(options)
    except ConfigError as exc:
        return report_problems(exc.problems, err)
    except MonitorError as exc:
        return report_problems([str(exc)], err)
    try:
        if options.watch:
            asyncio.run(_watch(plan, options, out, sys.stdin if keys is None else keys))
            return EXIT_OK
        return asyncio.run(_once(plan, options.as_json, out)).exit_code
    except KeyboardInterrupt:  # Ctrl-C before the watch's own handler is installed
        return EXIT_OK if options.watch else EXIT_INTERRUPTED
