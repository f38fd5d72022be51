"""The election and elastic groups across real hosts (network namespaces; needs root), default
timeouts, the cluster secret set, every daemon a voter.

(a) failover: 5 daemons; SIGKILL the coordinator, time until all 4 survivors follow one new
    coordinator in a higher term (and until they all apply its plan); restart the killed daemon
    and wait until all 5 follow one coordinator before the next kill. 20 kills. Target: median
    and max <= detection (lease_s + election_max_s) + 1.5 s; goal: median <= 1.2 s. With
    `--baseline-tree DIR` (another checkout, e.g. `git archive REV | tar -x -C DIR`) a second
    cluster of 5 runs that tree's daemons beside this one and the kills take turns.
(b) re-formation: 3 training daemons (gloo) each with a training process all_reducing in a loop;
    SIGKILL one host's daemon and trainer (rank 0's host, then another rank's, alternating), time
    until the 2 survivors complete an all_reduce over 2 ranks; restart the host's daemon and
    trainer and wait for the 3-rank group again. Target: <= 10 s.
Times come from one probe on a host of its own polling GET /v1/plan every 0.05 s, and from the
trainers' own timestamps (one monotonic clock). Prints JSON. Bounded (about 4 minutes), and
every namespace and process is removed at the end.
Usage: sudo .venv/bin/python bench/election_bench.py [--kills 20] [--regroups 4]
[--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from config import Timeouts  # noqa: E402
from tests.cluster import NetnsCluster, WaitTimeoutError, netns_unavailable_reason  # noqa: E402
from tests.node.election_netns_swarm import (  # noqa: E402
    START_S,
    Condition,
    ElectionWatch,
    PlanView,
    Views,
    agreed,
    converged,
    coordinator_of,
    start_voters,
)
from tests.node.groups_netns_trainers import TRAINING_SETTINGS, Trainers  # noqa: E402
from tests.node.netns_swarm import Swarm  # noqa: E402

KILLS = 20
REGROUPS = 4
VOTERS = 5
TRAINERS = 3
BUDGET_S = 270.0
"""Stop starting new kills or regroups past this much wall time (the whole run stays < 5 min)."""
WAIT_S = 30.0
DEFAULTS = Timeouts()
DETECTION_S = DEFAULTS.lease_s + DEFAULTS.election_max_s
TARGETS = {"failover_s": DETECTION_S + 1.5, "failover_median_s": 1.2, "regroup_s": 10.0}


def _stats(samples: list[float]) -> dict[str, float | None]:
    if not samples:
        return {"median_s": None, "max_s": None, "min_s": None}
    return {
        "median_s": round(statistics.median(samples), 2),
        "max_s": round(max(samples), 2),
        "min_s": round(min(samples), 2),
    }


def plan_applied(names: tuple[str, ...], min_term: int) -> Condition:
    """Every one of `names` applies one plan, made in `min_term` or later."""

    def check(views: Views) -> bool:
        fences = {views[n].plan if n in views else None for n in names}
        fence = fences.pop() if len(fences) == 1 else None
        return fence is not None and fence[0] >= min_term

    return check


def one_failover(swarm: Swarm, watch: ElectionWatch) -> dict[str, Any]:
    """Kill the coordinator, time the failover and the new plan, restart it, wait for all."""
    names = swarm.names
    leader, term = coordinator_of(watch.matched, names) or ("?", -1)
    survivors = swarm.others(leader)
    first_timer: list[float] = []

    def note(view: PlanView) -> None:
        # A survivor's election timer fired: it no longer names the dead coordinator.
        if view.host != leader and view.answered and view.coordinator != leader:
            first_timer.append(view.t)

    killed_at = time.monotonic()
    swarm.kill(leader)
    new_at = watch.wait(
        agreed(survivors, above_term=term, not_coordinator=leader),
        since=killed_at,
        timeout_s=WAIT_S,
        message="a new coordinator",
        on_view=note,
    )
    new_leader, new_term = coordinator_of(watch.matched, survivors) or ("?", term + 1)
    plan_at = watch.wait(
        plan_applied(survivors, new_term), since=killed_at, timeout_s=WAIT_S, message="its plan"
    )
    restarted_at = time.monotonic()
    swarm.start(swarm.host(leader))
    back_at = watch.wait(
        agreed(names), since=restarted_at, timeout_s=WAIT_S, message="all 5 following"
    )
    return {
        "victim": leader,
        "term": term,
        "new_coordinator": new_leader,
        "new_term": new_term,
        "first_timer_s": round(min(first_timer) - killed_at, 2) if first_timer else None,
        "failover_s": round(new_at - killed_at, 2),
        "plan_applied_s": round(plan_at - killed_at, 2),
        "restart_to_following_s": round(back_at - restarted_at, 2),
    }


def _failover_summary(
    per_kill: list[dict[str, Any]], kills: int, error: str | None
) -> dict[str, Any]:
    samples = [k["failover_s"] for k in per_kill]
    target = TARGETS["failover_s"]
    median = statistics.median(samples) if samples else None
    return {
        "kills": len(samples),
        **_stats(samples),
        "plan_applied": _stats([k["plan_applied_s"] for k in per_kill]),
        "first_timer": _stats([k["first_timer_s"] for k in per_kill if k["first_timer_s"]]),
        "detection_s": DETECTION_S,
        "target_s": target,
        "goal_median_s": TARGETS["failover_median_s"],
        "met": len(samples) == kills and max(samples, default=0.0) <= target,
        "goal_met": median is not None and median <= TARGETS["failover_median_s"],
        "error": error,
        "per_kill": per_kill,
    }


def failover(kills: int, deadline: float, trees: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """(a): kill the coordinator `kills` times, restarting it in between; one cluster per tree,
    all running at once, taking turns kill by kill (so load slows them alike)."""
    per_kill: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    errors: dict[str, str | None] = dict.fromkeys(trees)
    with ExitStack() as stack:
        running = {}
        for label, tree in trees.items():
            cluster = stack.enter_context(NetnsCluster(VOTERS + 1))
            running[label] = start_voters(cluster, VOTERS, tree=tree)
        for swarm, watch in running.values():
            watch.wait(converged(swarm.names), since=0.0, timeout_s=START_S, message="a plan")
        for index in range(kills):
            order = list(running) if index % 2 == 0 else list(reversed(running))
            for label in order:
                if time.monotonic() > deadline:
                    errors[label] = errors[label] or "time budget spent"
                    continue
                if errors[label] is not None:
                    continue
                try:
                    per_kill[label].append(one_failover(*running[label]))
                except WaitTimeoutError as exc:
                    errors[label] = str(exc)[:400]
    return {label: _failover_summary(per_kill[label], kills, errors[label]) for label in trees}


def regroup(repetitions: int, deadline: float) -> dict[str, Any]:
    """(b): kill one training host (daemon and trainer) at a time, restarting it in between."""
    samples: list[float] = []
    per_kill: list[dict[str, Any]] = []
    with NetnsCluster(TRAINERS + 1) as cluster:
        swarm, watch = start_voters(cluster, TRAINERS, settings=TRAINING_SETTINGS)
        names = swarm.names

        def all_train(views: Views) -> bool:
            return converged(names)(views) and set(views[names[0]].ranks or ()) == set(names)

        watch.wait(all_train, since=0.0, timeout_s=START_S, message="3 training nodes")
        trainers = Trainers(swarm)
        trainers.start_all()
        ready = trainers.wait_reduced(names, TRAINERS, since=0.0, timeout_s=START_S, count=5)
        for index in range(repetitions):
            if time.monotonic() > deadline:
                break
            ranks = {name: event.rank for name, event in ready.items()}
            wanted_rank = 0 if index % 2 == 0 else TRAINERS - 1
            victim = next(name for name, rank in ranks.items() if rank == wanted_rank)
            survivors = swarm.others(victim)
            coordinator = watch.latest[survivors[0]].coordinator
            killed_at = time.monotonic()
            trainers.kill(victim)
            swarm.kill(victim)
            try:
                reformed = trainers.wait_reduced(
                    survivors, TRAINERS - 1, since=killed_at, timeout_s=WAIT_S
                )
            except WaitTimeoutError as exc:
                per_kill.append({"victim": victim, "error": str(exc)[:300]})
                break
            elapsed = max(event.t for event in reformed.values()) - killed_at
            samples.append(elapsed)
            restarted_at = time.monotonic()
            swarm.start(swarm.host(victim))
            trainers.start(swarm.host(victim))
            ready = trainers.wait_reduced(
                names, TRAINERS, since=restarted_at, timeout_s=WAIT_S * 2, count=3
            )
            per_kill.append(
                {
                    "victim": victim,
                    "victim_rank": wanted_rank,
                    "victim_was_coordinator": victim == coordinator,
                    "kill_to_two_rank_all_reduce_s": round(elapsed, 2),
                    "restart_to_three_rank_all_reduce_s": round(
                        max(e.t for e in ready.values()) - restarted_at, 2
                    ),
                }
            )
    target = TARGETS["regroup_s"]
    return {
        "repetitions": len(samples),
        **_stats(samples),
        "target_s": target,
        "met": bool(samples) and len(samples) == repetitions and max(samples) <= target,
        "per_kill": per_kill,
    }


def run(
    kills: int = KILLS, regroups: int = REGROUPS, baseline_tree: Path | None = None
) -> dict[str, Any]:
    reason = netns_unavailable_reason()
    if reason is not None:
        return {"bench": "election", "skipped": reason}
    started = time.monotonic()
    deadline = started + BUDGET_S * (2 if baseline_tree else 1)
    trees = {"this tree": ROOT}
    if baseline_tree is not None:
        trees["baseline tree"] = baseline_tree
    result_failover = failover(kills, deadline - 75.0, trees) if kills else {}
    result_regroup = regroup(regroups, deadline) if regroups else None
    result: dict[str, Any] = {
        "bench": "election",
        "setup": "netns hosts on one bridge; default timeouts (lease_s "
        f"{DEFAULTS.lease_s}, election {DEFAULTS.election_min_s}-{DEFAULTS.election_max_s} s, "
        f"heartbeat {DEFAULTS.heartbeat_interval_s} s); inventory voters; secret set; probe "
        "polls /v1/plan every 0.05 s; trainers: gloo, collective timeout 5 s",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": os.getloadavg(),
        "failover": result_failover.get("this tree"),
        "regroup": result_regroup,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    if baseline_tree is not None:
        result["baseline"] = {
            "tree": str(baseline_tree),
            "failover": result_failover.get("baseline tree"),
        }
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=KILLS)
    parser.add_argument("--regroups", type=int, default=REGROUPS)
    parser.add_argument(
        "--baseline-tree", type=Path, default=None, help="another checkout, killed in turns"
    )
    args = parser.parse_args(argv)
    tree = args.baseline_tree.resolve() if args.baseline_tree else None
    print(json.dumps(run(args.kills, args.regroups, tree), indent=2))


if __name__ == "__main__":
    main()
