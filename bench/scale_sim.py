"""Scale past one machine on paper: N members of the daemon's real membership code (SWIM with
Lifeguard) and its real planning code, over a simulated network with a virtual clock, in one
process (issue 37; the figures and limits are docs/scale.md).

For each N it reports: the time until every live member knows of a SIGKILLed member (p50 and
p99 over the kills), false deaths at 1% and 5% datagram loss, membership bytes per second per
node in steady state (sealed as the daemon seals them), the time to converge after a 10%
partition heals; and for N nodes of 8 GPUs: the wall time of compute_plan, the plan's size on
the wire, the time until every node applies a new plan and the coordinator's egress for it.
Times are simulated seconds, except plan_compute_s (wall time on this machine).

Usage: python bench/scale_sim.py --nodes 1000 [--nodes 5000 ...] [--loss P] [--seed S] [--json]
       [--jobs J]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scale_fork import Branch, default_jobs, run_branches  # noqa: E402
from bench.scale_members import (  # noqa: E402
    SimCluster,
    kills,
    lossy_windows,
    partition_heal,
    percentile,
    push_pull,
)
from bench.scale_net import VirtualLoop  # noqa: E402
from bench.scale_plans import plan_compute, plan_travel  # noqa: E402
from config.timeouts import Timeouts  # noqa: E402

BASELINE_LIMIT_S = 30.0
"""How long the previous release's way of sending plans is followed (it may take longer)."""
LOSS_LEVELS = (0.01, 0.05)
PARTITION_FRACTION = 0.1


PARTITION_LIMIT = 500
"""The largest N whose partition is simulated by default. The cut and the heal make every
member gossip about a tenth of the others (suspicions, deaths, then refutations), work that
grows as N squared: its branch takes about 2 minutes of CPU at 400 members, and did not end in
16 minutes at 1,000 (docs/scale.md)."""
GOALS_AT = 10_000
WINDOW_PROBES = 20_000
"""Probes each loss window holds (N / probe_interval_s per second): 6 s at 1,000 members."""
MIN_WINDOW_S = 1.0
"""Three probe rounds: 1.2 s at 5,000 members, 1 s at 10,000 (33,000 probes). It was 2 s, and
the 5% window at 10,000 members then took 8 minutes of CPU on its own (docs/scale.md)."""


def loss_window_s(nodes: int, timeouts: Timeouts) -> float:
    """How long each loss level lasts: WINDOW_PROBES probes, at least MIN_WINDOW_S (three probe
    rounds). A larger cluster probes more each second, so its windows hold as many chances of a
    false death in a shorter time; every false suspicion is gossiped to all N members, so the
    windows' cost grows as N squared (`--loss-window-s` sets a longer one)."""
    return max(MIN_WINDOW_S, WINDOW_PROBES * timeouts.probe_interval_s / nodes)


@dataclass(frozen=True, slots=True)
class Goals:
    """Issue 37's goals at GOALS_AT members (docs/scale.md's goals table must match)."""

    death_known_p99_s: float = 6.0
    false_deaths_at_1pct: int = 0
    bytes_per_s_per_node: float = 2048.0
    plan_compute_s: float = 0.2
    plan_apply_s: float = 5.0
    coordinator_plan_egress_bytes: int = 20_000_000


def goals_for(nodes: int) -> Goals:
    """The goals at `nodes` members: compute time and the coordinator's egress in proportion to
    N; the death's p99 (a smaller cluster's suspicions are shorter: log10 N), false deaths,
    traffic per node and the apply time as at GOALS_AT."""
    goals = Goals()
    share = nodes / GOALS_AT
    return replace(
        goals,
        plan_compute_s=round(goals.plan_compute_s * share, 4),
        coordinator_plan_egress_bytes=round(goals.coordinator_plan_egress_bytes * share),
    )


@dataclass(frozen=True, slots=True)
class Options:
    """What one run simulates; the partition only while nodes <= partition_limit."""

    nodes: int
    seed: int = 1
    loss: float | None = None
    kills: int = 5
    kill_gap_s: float = 0.5
    settle_s: float = 1.0
    steady_s: float = 3.0
    loss_window_s: float | None = None
    partition_limit: int = PARTITION_LIMIT
    converge_limit_s: float = 120.0
    baseline: bool = False
    jobs: int = 1


def _progress(loop: VirtualLoop, what: str) -> None:
    """One line on stderr per phase: virtual time and CPU seconds so far."""
    _progress_line(f"[{loop.time() - 1000:8.1f} sim s] {what}")


def _progress_line(what: str) -> None:
    if _VERBOSE:
        print(f"  [{time.process_time():7.1f} cpu s] {what}", file=sys.stderr, flush=True)


_VERBOSE = False
_EXTRA: dict[str, Any] = {}
"""Figures of the table beside --json's, of the N being simulated."""


async def _membership(options: Options) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualLoop)
    cluster = SimCluster(loop, options.nodes, options.seed)
    gc.disable()  # N views of N members: collections while they are built cost N^2 each
    await cluster.start()
    _progress(loop, f"{options.nodes} members started")
    gc.collect()
    gc.freeze()
    gc.enable()
    await cluster.run_for(options.settle_s)
    _progress(loop, "settled")
    levels = sorted({*LOSS_LEVELS, *([options.loss] if options.loss else [])})
    window_s = options.loss_window_s or loss_window_s(options.nodes, cluster.timeouts)
    # the costliest first, so that the cheap ones share the other cores meanwhile: the
    # partition, the loss levels, highest first (each false suspicion is gossiped to all), the
    # kills, then the steady state
    branches: dict[str, Branch] = {}
    if options.nodes <= options.partition_limit:
        branches["partition"] = partial(_partition, cluster, options)
    for level in reversed(levels):
        branches[f"{level:g}"] = partial(_false_deaths, cluster, level, window_s)
    branches["kills"] = partial(_kills, cluster, options)
    branches["steady"] = partial(_steady, cluster, options)
    answers = await run_branches(branches, options.jobs)
    rate: float = answers.pop("steady")
    known: list[float] = answers.pop("kills")
    converge: float | None = answers.pop("partition", None)
    false_deaths: dict[str, int] = {f"{level:g}": answers[f"{level:g}"] for level in levels}
    full, every = push_pull(options.nodes, cluster.timeouts, cluster.tuning)
    _EXTRA["push_pull_bytes_per_s"] = round(2 * full / every)
    _EXTRA["full_state_bytes"] = full
    await cluster.close()
    gc.unfreeze()
    return {
        "death_known_p50_s": _seconds(percentile(known, 0.5)),
        "death_known_p99_s": _seconds(percentile(known, 0.99)),
        "false_deaths": false_deaths,
        "bytes_per_s_per_node": round(rate, 1),
        "partition_converge_s": None if converge is None else _seconds(converge),
    }


async def _steady(cluster: SimCluster, options: Options) -> float:
    """A branch: `options.steady_s` without loss or deaths; membership bytes per second per
    node, as sealed on the wire."""
    sent = cluster.network.sent_bytes
    await cluster.run_for(options.steady_s)
    rate = (cluster.network.sent_bytes - sent) / options.steady_s / options.nodes
    _progress(cluster.loop, f"steady: {rate:.0f} B/s per node")
    return rate


async def _kills(cluster: SimCluster, options: Options) -> list[float]:
    """A branch: `options.kills` members SIGKILLed (at `options.loss`, if any)."""
    cluster.network.loss = options.loss or 0.0
    known = await kills(cluster, options.kills, options.kill_gap_s, 60.0)
    _progress(cluster.loop, f"kills: all know after {[round(k, 2) for k in known]} s")
    return known


async def _false_deaths(cluster: SimCluster, level: float, window_s: float) -> int:
    """A branch: one window at datagram loss `level`, then loss-free until no live member is
    suspected; live members declared dead for suspicions begun in the window."""
    deaths = await lossy_windows(cluster, [level], window_s)
    suspected = len(cluster.seen.first_suspect)  # (member, incarnation) suspected in the branch
    _progress(cluster.loop, f"false deaths at {level:g} loss: {deaths[level]} of {suspected}")
    return deaths[level]


async def _partition(cluster: SimCluster, options: Options) -> float | None:
    """A branch: a 10% partition (at `options.loss`, if any) held, healed, and converged."""
    cluster.network.loss = options.loss or 0.0
    converge = await partition_heal(cluster, PARTITION_FRACTION, options.converge_limit_s)
    _progress(cluster.loop, f"partition healed, converged after {converge} s")
    return converge


def _seconds(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 3)


def _plans(options: Options) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan figures (`--json`'s), and for the table: CPU time of compute_plan, whether the
    coordinator kept its lease, and the previous release's way (the plan whole to each)."""
    cpu = time.process_time()
    previous, plan, compute_s = plan_compute(options.nodes)
    travel = plan_travel(previous, plan)
    applied = travel.run()
    figures = {
        "plan_compute_s": round(compute_s, 4),
        "plan_bytes": travel.plan_bytes,
        "plan_apply_s": None if applied is None else round(applied, 3),
        "coordinator_plan_egress_bytes": travel.egress_bytes,
    }
    extra: dict[str, Any] = {
        **_EXTRA,
        "lease_lost_at_s": travel.stepped_down_at,
        "request_cpu_s": travel.costs.request_s,
        "ack_cpu_s": round(travel.ack_cpu_s, 3),
    }
    if options.baseline:
        whole = plan_travel(previous, plan, pulls=False)
        applied_whole = whole.run(until_s=BASELINE_LIMIT_S)
        extra["whole_apply_s"] = (
            f"> {BASELINE_LIMIT_S:g}" if applied_whole is None else round(applied_whole, 2)
        )
        extra["whole_egress_bytes"] = whole.egress_bytes
    _progress_line(f"plans: {figures} {extra} ({time.process_time() - cpu:.1f} cpu s)")
    return figures, extra


def simulate(options: Options) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures of one N in the `--json` shape, and the table's extra figures."""
    loop = VirtualLoop()
    try:
        figures = loop.run_until_complete(_membership(options))
    finally:
        loop.close()
    plans, extra = _plans(options)
    return {"nodes": options.nodes, **figures, **plans}, extra


ROWS = (
    ("death known by all, p50 (s)", "death_known_p50_s", None),
    ("death known by all, p99 (s)", "death_known_p99_s", "death_known_p99_s"),
    ("false deaths at 1% loss", "false_deaths.0.01", "false_deaths_at_1pct"),
    ("false deaths at 5% loss", "false_deaths.0.05", None),
    ("membership bytes/s per node", "bytes_per_s_per_node", "bytes_per_s_per_node"),
    ("a member's full state, sealed (bytes)", "+full_state_bytes", None),
    ("push-pull bytes/s per node while views differ", "+push_pull_bytes_per_s", None),
    ("converged after a 10% partition healed (s)", "partition_converge_s", None),
    ("compute_plan, wall (s)", "plan_compute_s", "plan_compute_s"),
    ("plan on the wire (bytes)", "plan_bytes", None),
    ("plan applied by all (s)", "plan_apply_s", "plan_apply_s"),
    ("coordinator egress for the plan (bytes)", "coordinator_plan_egress_bytes",
     "coordinator_plan_egress_bytes"),
    ("coordinator lost its lease at (s)", "+lease_lost_at_s", None),
    ("previous release: plan applied by all (s)", "+whole_apply_s", None),
    ("previous release: coordinator egress (bytes)", "+whole_egress_bytes", None),
    ("run: wall / CPU (s)", "+run", None),
)  # fmt: skip


def _cell(result: dict[str, Any], extra: dict[str, Any], key: str) -> str:
    source: Any = extra if key.startswith("+") else result
    for part in key.lstrip("+").split(".", 1) if key.startswith("false") else [key.lstrip("+")]:
        source = source.get(part) if isinstance(source, dict) else None
    if source is None:
        return "-"
    return f"{source:,}" if isinstance(source, int) else str(source)


def table(runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The figures of every N as a Markdown table, with each goal scaled to that N."""
    head = "| figure | " + " | ".join(f"{r['nodes']:,} | goal" for r, _ in runs) + " |"
    lines = [head, "|---|" + "---|---|" * len(runs)]
    for label, key, goal in ROWS:
        cells = []
        for result, extra in runs:
            target = getattr(goals_for(result["nodes"]), goal) if goal else None
            cells += [_cell(result, extra, key), "-" if target is None else f"{target:,}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _hash_seed() -> None:
    """Re-run under PYTHONHASHSEED=0: sets of node ids iterate alike in every run, so a seed
    repeats a run exactly."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", action="append", help="members (repeat, or 1000,5000)")
    parser.add_argument("--loss", type=float, default=None, help="datagram loss in every phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON object per N")
    parser.add_argument("--verbose", action="store_true", help="each phase's progress on stderr")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLed members")
    parser.add_argument(
        "--loss-window-s", type=float, default=None, help="each loss level's window (s)"
    )
    parser.add_argument(
        "--partition-limit", type=int, default=PARTITION_LIMIT, help="largest N partitioned"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help="branches (kills, each loss level, the partition) simulated at once, each in a "
        "process forked from the settled cluster; the figures do not depend on it "
        "(default: the CPUs this process may use)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    _hash_seed()
    global _VERBOSE
    _VERBOSE = args.verbose
    sizes = [int(n) for item in args.nodes or ["1000"] for n in item.split(",") if n]
    logging.basicConfig(level=logging.ERROR)
    runs = []
    for size in sizes:
        wall, cpu = time.perf_counter(), time.process_time()
        options = Options(
            size,
            seed=args.seed,
            loss=args.loss,
            kills=args.kills,
            loss_window_s=args.loss_window_s,
            partition_limit=args.partition_limit,
            baseline=not args.json,
            jobs=args.jobs,
        )
        result, extra = simulate(options)
        extra["run"] = f"{time.perf_counter() - wall:.0f} / {time.process_time() - cpu:.0f}"
        if args.json:
            print(json.dumps(result), flush=True)
        runs.append((result, extra))
    if not args.json:
        print(f"scale_sim, seed {args.seed}, loss {args.loss or 0}:\n{table(runs)}")


if __name__ == "__main__":
    main()
