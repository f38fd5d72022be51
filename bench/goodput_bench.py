"""Goodput under injected faults, beside torchrun (issue 33): the same training script
(examples/train.py: a fixed step time, a save about every 10 s) on `--hosts` network-namespace
hosts (needs root), first under shoal, then under plain torchrun, with the same seeded fault
every `--every-s` seconds (bench/goodput_faults.py: a worker's SIGKILL, a host's SIGKILL down
30 s, a worker's SIGSTOP, an Xid 79 cleared after 30 s, a host partitioned 20 s, a host's data
dir wiped and the host restarted). For each system it prints goodput, steps lost, and per fault
its kind and the time from the fault to the group's next step (bench/goodput_score.py defines
them), with the medians per kind and the live state transfers seen.

Usage: sudo .venv/bin/python bench/goodput_bench.py --minutes 3 --seed 7 [--json] [--hosts 4]
[--systems shoal,torchrun] [--step-s 0.1] [--save-s 10] [--hang-s 6] [--keep DIR]
[--kinds KIND,...] [--every-s 60] [--first-s S] [--settle-s S]

Bounded in time (a system that does not start within --start-s is reported as such); every
namespace, process and file is removed at the end, on an error and on SIGINT or SIGTERM
(--keep DIR keeps the progress lines and logs there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.goodput_committed import committed_lost, wipe_restores  # noqa: E402
from bench.goodput_faults import FaultKind, PlannedFault, schedule  # noqa: E402
from bench.goodput_score import AppliedFault, read_progress, score  # noqa: E402
from bench.goodput_systems import BenchSettings, System, systems  # noqa: E402
from tests.cluster import NetnsCluster, netns_unavailable_reason  # noqa: E402

TICK_S = 0.2


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="minutes of faults per system")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--systems", default="shoal,torchrun")
    parser.add_argument("--every-s", type=float, default=60.0, help="one fault this often")
    parser.add_argument("--first-s", type=float, default=None, help="the first (every-s / 2)")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="after the run, wait up to this long for each wiped host's restore (not scored)",
    )
    parser.add_argument("--kinds", default=",".join(FaultKind), help="fault kinds to draw from")
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--save-s", type=float, default=10.0)
    parser.add_argument("--hang-s", type=float, default=6.0, help="shoal's training_hang_s")
    parser.add_argument("--collective-s", type=float, default=10.0)
    parser.add_argument(
        "--reform",
        choices=("in_place", "restart"),
        default="in_place",
        help="shoal's training_reform: keep running workers (in_place) or start all again",
    )
    parser.add_argument("--start-s", type=float, default=300.0, help="bound on the first step")
    parser.add_argument("--keep", type=Path, default=None, help="keep progress and logs here")
    args = parser.parse_args(argv)
    if args.hosts < 4 and argv is None:
        parser.error("the bench runs at least 4 hosts (the suite's short run may use fewer)")
    return args


class Run:
    """One system's run: its faults applied on schedule, undone when they end."""

    def __init__(self, system: System, cluster: NetnsCluster) -> None:
        self.system = system
        self.cluster = cluster
        self.applied: list[AppliedFault] = []
        self._undo: list[tuple[float, Callable[[], object]]] = []
        self._supervised_at = 0.0

    def wait_until(self, when: float) -> None:
        while (now := time.time()) < when:
            for due in [entry for entry in self._undo if entry[0] <= now]:
                self._undo.remove(due)
                due[1]()
            if now - self._supervised_at >= 1.0:
                self._supervised_at = now
                self.system.supervise()
            time.sleep(min(TICK_S, max(0.0, when - now)))

    def apply(self, fault: PlannedFault) -> None:
        system, host = self.system, self.cluster.hosts[fault.host]
        lasts = fault.kind.lasts_s
        applicable = True
        if fault.kind is FaultKind.WORKER_KILL:
            applicable = system.signal_worker(host, signal.SIGKILL) is not None
        elif fault.kind is FaultKind.WORKER_HANG:
            applicable = system.signal_worker(host, signal.SIGSTOP) is not None
        elif fault.kind is FaultKind.HOST_KILL:
            system.host_down(host)
            self._undo.append((time.time() + lasts, lambda: system.host_up(host)))
        elif fault.kind is FaultKind.XID:
            applicable = system.xid(host, True)
            if applicable:
                self._undo.append((time.time() + lasts, lambda: system.xid(host, False)))
        elif fault.kind is FaultKind.PARTITION:
            others = [h for h in self.cluster.hosts if h is not host]
            self.cluster.partition([host], others)
            self._undo.append((time.time() + lasts, self.cluster.heal))
        elif fault.kind is FaultKind.WIPE:
            system.wipe(host)
        self.applied.append(AppliedFault(fault.kind.value, host.name, time.time(), applicable))


def first_step(progress: Path, system: System, deadline: float) -> float | None:
    """The unix time of the group's first step, or None at `deadline`."""
    while time.time() < deadline:
        steps = [line for line in read_progress(progress) if line.get("event") == "step"]
        if steps:
            return float(steps[0]["t"])
        system.supervise()
        time.sleep(1.0)
    return None


def checkpoint_figures(
    system: System, lines: list[dict[str, Any]], applied: list[AppliedFault]
) -> dict[str, Any]:
    """Committed steps lost (each group's restore beside the newest step committed before it
    started), the wiped hosts' restores (from peers?), the restores' sources and times, and
    (in place) the state ranks took from a live peer: how many times, bytes, seconds (the
    agreement and transfer, not the forming of the group)."""
    lost, restores = committed_lost(lines, system.committed)
    wipes = [(fault.host, fault.at) for fault in applied if fault.kind == FaultKind.WIPE.value]
    seconds = [
        float(line["seconds"])
        for line in lines
        if line.get("event") == "restored" and line.get("rank") == 0 and line.get("step")
    ]
    live = [
        line
        for line in lines
        if line.get("event") in ("restored", "reformed") and line.get("source") == "peer"
    ]
    return {
        "live_transfers": {
            "count": len(live),
            "bytes_median": statistics.median(int(line["bytes"]) for line in live)
            if live
            else None,
            "seconds_median": round(statistics.median(float(line["seconds"]) for line in live), 3)
            if live
            else None,
        },
        "committed_steps_lost": lost,
        "committed_final": system.committed[-1][1] if system.committed else None,
        "group_restores": restores,
        "restore_s_median": round(statistics.median(seconds), 2) if seconds else None,
        "wiped_hosts": wipe_restores(system.restores, wipes, system.committed)
        if system.restores
        else [],
    }


def settle(system: System, run: Run, deadline: float) -> None:
    """Collect what the system says; until `deadline`, again while a wiped host has not
    restored since its wipe (a restore after the run is not scored, only seen)."""
    wipes = [(fault.host, fault.at) for fault in run.applied if fault.kind == FaultKind.WIPE.value]
    system.collect()
    while time.time() < deadline and system.restores:
        if all(entry["restore"] for entry in wipe_restores(system.restores, wipes)):
            return
        run.wait_until(min(deadline, time.time() + 2.0))
        system.collect()


def run_system(
    kind: type[System], args: argparse.Namespace, planned: list[PlannedFault]
) -> dict[str, Any]:
    with NetnsCluster(args.hosts + 1) as cluster:  # the last host: the probe's, no faults
        progress, shared = cluster.base_dir / "progress", cluster.base_dir / "shared"
        progress.mkdir()
        shared.mkdir()
        settings = BenchSettings(
            args.step_s, args.save_s, args.hang_s, args.collective_s, progress, shared, args.reform
        )
        system = kind(cluster, settings, cluster.hosts[: args.hosts])
        try:
            system.start()
            t0 = first_step(progress, system, time.time() + args.start_s)
            if t0 is None:
                return {"error": f"no step within {args.start_s:g} s of the start"}
            run = Run(system, cluster)
            for fault in planned:
                run.wait_until(t0 + fault.at_s)
                run.apply(fault)
            end = t0 + args.minutes * 60.0
            run.wait_until(end)
            settle(system, run, time.time() + args.settle_s)
            lines = read_progress(progress)
            result = score(lines, run.applied, end).to_json()
            result.update(checkpoint_figures(system, lines, run.applied))
            result["notes"] = system.notes[-20:]
            return result
        finally:
            system.close()
            if args.keep is not None:
                target = args.keep / kind.name
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(cluster.base_dir, target, ignore=shutil.ignore_patterns("*.sock"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = arguments(argv)
    reason = netns_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"goodput_bench needs network namespaces: {reason}")
    kinds = tuple(FaultKind(kind) for kind in args.kinds.split(","))
    planned = schedule(
        args.minutes, args.seed, args.hosts, every_s=args.every_s, kinds=kinds, first_s=args.first_s
    )
    report: dict[str, Any] = {
        "seed": args.seed,
        "minutes": args.minutes,
        "hosts": args.hosts,
        "step_s": args.step_s,
        "save_s": args.save_s,
        "hang_s": args.hang_s,
        "collective_s": args.collective_s,
        "reform": args.reform,
        "fault_every_s": args.every_s,
        "planned": [{"kind": f.kind.value, "host": f"h{f.host}", "at": f.at_s} for f in planned],
        "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    for kind in systems(args.systems.split(",")):
        report[kind.name] = run_system(kind, args, planned)
    report["machine"]["load_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=None))
    else:
        print_report(report)
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"goodput bench: {report['hosts']} hosts, {report['minutes']} min, seed {report['seed']}")
    for name in ("shoal", "torchrun"):
        result = report.get(name)
        if result is None:
            continue
        if "error" in result:
            print(f"  {name}: {result['error']}")
            continue
        print(
            f"  {name}: goodput {result['goodput']:.3f}, steps lost {result['steps_lost']}, "
            f"step {result['step_time_s']:.3f} s, final step {result['final_step']}"
        )
        for fault in result["faults"]:
            print(
                f"    {fault['at']:>6} s {fault['kind']:<12} {fault['host']}: next step "
                f"{fault['to_next_step_s']} s, lost {fault['steps_lost']}"
            )


if __name__ == "__main__":
    main()
