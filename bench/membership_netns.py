"""Membership across real hosts: `shoal serve` daemons in network namespaces (needs root),
default timeouts, discovery by inventory and mDNS, the cluster secret set; 8 daemons by
default, `--nodes 3` for the 3-host figure of docs/benchmarks.md.

(a) kill-to-dead: SIGKILL one daemon; time until each other daemon's /v1/peers shows it dead,
    10 kills, the killed daemon restarted (and all alive everywhere) before the next. Targets:
    median <= 1.5 s, max <= 5 s over every (kill, peer) sample. With `--baseline-tree DIR`
    (another checkout, e.g. `git archive REV | tar -x -C DIR`) a second cluster runs that
    tree's daemons beside this one, and the kills alternate between the two, so load slows both
    alike.
(b) partition: cut 3 daemons (a different 3 each time) from the other 5, 5 times; time until
    every daemon of each side shows all of the other side dead, then heal. Target: the
    minority side decides within 5 s every time; no node is ever dead on its own side.
(c) idle cost of one daemon among 8 members: VmRSS and CPU (utime + stime) over 10 s while
    nothing polls the daemons. Targets: <= 80 MB, <= 1 % of one CPU.
(d) `--busy-s 60`: a node that is busy is not dead. 3 daemons, the first host's link limited
    to 20 Mbit/s with `tc` and saturated both ways by the background sync for that long
    (tests/node/netns_busy.py): membership events counted by every daemon (target: 0 deaths),
    then the busy member SIGKILLed with its link still full and timed until dead at both peers.
Times come from one probe process on a host of its own polling every daemon every 0.1 s
(resolution). Prints JSON. Usage: sudo .venv/bin/python bench/membership_netns.py [--nodes 8]
[--kills 10] [--partitions 5] [--idle-s 10] [--busy-s 0] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster import (  # noqa: E402
    Host,
    NetnsCluster,
    WaitTimeoutError,
    netns_unavailable_reason,
)
from tests.node.netns_busy import run_busy  # noqa: E402
from tests.node.netns_swarm import (  # noqa: E402
    Observation,
    Split,
    Swarm,
    all_alive,
    everyone_sees,
    inventory_yaml,
)

NODES = 8
KILLS = 10
PARTITIONS = 5
MINORITY = 3
PARTITION_WAIT_S = 30.0
IDLE_S = 10.0
PROBE_INTERVAL_S = 0.1
START_S = 60.0
DEAD_WAIT_S = 15.0
REJOIN_WAIT_S = 30.0
TARGETS = {
    "kill_to_dead_median_s": 1.5,
    "kill_to_dead_max_s": 5.0,
    "minority_detect_max_s": 5.0,
    "idle_rss_mb": 80.0,
    "idle_cpu_percent": 1.0,
}


@contextmanager
def running_swarm(nodes: int = NODES, tree: Path = ROOT) -> Iterator[Swarm]:
    """`nodes` daemons of `tree` (inventory + mDNS) plus the probe on a host of its own, all
    alive."""
    with NetnsCluster(nodes + 1) as cluster:
        hosts, probe_host = cluster.hosts[:nodes], cluster.hosts[nodes]
        inventory = cluster.base_dir / "hosts.yaml"
        inventory.write_text(inventory_yaml(hosts, "shoal"), encoding="utf-8")

        def serve_args(host: Host) -> list[str]:
            return ["--inventory", str(inventory)]

        swarm = Swarm(cluster, hosts, probe_host, serve_args, tree=tree)
        swarm.start_probe(PROBE_INTERVAL_S)
        swarm.start_all()
        ready = swarm.wait_answering(START_S)
        swarm.watch.wait(
            all_alive(swarm.names), since=ready, timeout_s=START_S, message="all alive"
        )
        yield swarm


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def idle_cost(swarm: Swarm, seconds: float = IDLE_S) -> dict[str, Any]:
    """RSS and CPU of every daemon over `seconds` with the probe paused (nothing polls them)."""
    probe = swarm.watch.probe
    pids = {name: proc.pid for name, proc in swarm.daemons.items()}
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    probe.stop()
    try:
        started, ticks_before = time.monotonic(), {n: _cpu_ticks(p) for n, p in pids.items()}
        rss_peak = {n: _rss_kb(p) for n, p in pids.items()}
        while time.monotonic() - started < seconds:
            time.sleep(0.5)
            for name, pid in pids.items():
                rss_peak[name] = max(rss_peak[name], _rss_kb(pid))
        elapsed = time.monotonic() - started
        ticks = {n: _cpu_ticks(p) - ticks_before[n] for n, p in pids.items()}
    finally:
        probe.cont()
    cpu = {n: round(100.0 * t * tick_s / elapsed, 3) for n, t in ticks.items()}
    rss = {n: round(kb / 1024, 1) for n, kb in rss_peak.items()}
    return {
        "seconds": round(elapsed, 2),
        "members": len(pids),
        "rss_mb": {"max": max(rss.values()), "mean": round(statistics.mean(rss.values()), 1)},
        "cpu_percent": {"max": max(cpu.values()), "mean": round(statistics.mean(cpu.values()), 3)},
        "per_node": {n: {"rss_mb": rss[n], "cpu_percent": cpu[n]} for n in sorted(pids)},
        "targets": {"rss_mb": TARGETS["idle_rss_mb"], "cpu_percent": TARGETS["idle_cpu_percent"]},
        "met": {
            "rss": max(rss.values()) <= TARGETS["idle_rss_mb"],
            "cpu": max(cpu.values()) <= TARGETS["idle_cpu_percent"],
        },
    }


@dataclass
class KillResult:
    """Seconds from one SIGKILL until each other daemon showed the victim dead, until the first
    showed it suspect, and from its restart until all were alive everywhere (None: timed out)."""

    first_dead: dict[str, float] = field(default_factory=dict)
    first_suspect: float | None = None
    rejoin_s: float | None = None


def _one_kill(swarm: Swarm, victim: str) -> KillResult:
    """Kill `victim`, time its detection, restart it and wait until all are alive again."""
    watch, others = swarm.watch, swarm.others(victim)
    result = KillResult()
    killed_at = time.monotonic()

    def note(observation: Observation) -> None:
        if observation.t < killed_at or observation.host == victim:
            return
        state = observation.state_of(victim)
        if state == "dead":
            result.first_dead.setdefault(observation.host, observation.t - killed_at)
        if state in ("suspect", "dead") and result.first_suspect is None:
            result.first_suspect = observation.t - killed_at

    swarm.kill(victim)
    with suppress(WaitTimeoutError):  # a missed peer counts in `missed_samples`
        watch.wait(
            everyone_sees(victim, {"dead"}, others),
            since=killed_at,
            timeout_s=DEAD_WAIT_S,
            message=f"{victim} dead everywhere",
            on_observation=note,
        )
    restarted_at = time.monotonic()
    swarm.start(swarm.host(victim))
    try:
        whole_at = watch.wait(
            all_alive(swarm.names),
            since=restarted_at,
            timeout_s=REJOIN_WAIT_S,
            message=f"{victim} back",
        )
    except WaitTimeoutError:
        return result
    result.rejoin_s = whole_at - restarted_at
    return result


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@dataclass
class KillLog:
    """The kills of one swarm so far."""

    samples: list[float] = field(default_factory=list)
    per_kill: list[dict[str, Any]] = field(default_factory=list)
    missed: int = 0
    stopped: bool = False

    def kill(self, swarm: Swarm, index: int) -> None:
        """The `index`-th kill (round robin over the daemons); stops when one never rejoined."""
        victim = swarm.names[(index + 1) % len(swarm.names)]
        kill = _one_kill(swarm, victim)
        dead = kill.first_dead
        expected = len(swarm.names) - 1
        self.missed += expected - len(dead)
        self.samples.extend(dead.values())
        self.per_kill.append(
            {
                "victim": victim,
                "first_suspect_s": _rounded(kill.first_suspect),
                "first_peer_dead_s": _rounded(min(dead.values(), default=None)),
                "all_peers_dead_s": _rounded(max(dead.values())) if len(dead) == expected else None,
                "restart_to_all_alive_s": _rounded(kill.rejoin_s),
            }
        )
        self.stopped = kill.rejoin_s is None

    def summary(self) -> dict[str, Any]:
        samples, missed = self.samples, self.missed
        median = statistics.median(samples) if samples else None
        worst = max(samples) if samples else None
        suspects = [k["first_suspect_s"] for k in self.per_kill if k["first_suspect_s"]]
        return {
            "kills": len(self.per_kill),
            "samples": len(samples),
            "missed_samples": missed,
            "median_s": _rounded(median),
            "p90_s": round(statistics.quantiles(samples, n=10)[-1], 2)
            if len(samples) > 1
            else None,
            "max_s": _rounded(worst),
            "first_suspect_median_s": _rounded(statistics.median(suspects)) if suspects else None,
            "per_kill": self.per_kill,
            "targets": {
                "median_s": TARGETS["kill_to_dead_median_s"],
                "max_s": TARGETS["kill_to_dead_max_s"],
            },
            "met": {
                "median": median is not None
                and missed == 0
                and median <= TARGETS["kill_to_dead_median_s"],
                "max": worst is not None and missed == 0 and worst <= TARGETS["kill_to_dead_max_s"],
            },
        }


def kill_to_dead(swarms: dict[str, Swarm], kills: int = KILLS) -> dict[str, dict[str, Any]]:
    """SIGKILL a daemon of each swarm `kills` times (a different one each time, round robin),
    taking turns between the swarms kill by kill (the first swarm first on even kills)."""
    logs = {label: KillLog() for label in swarms}
    for index in range(kills):
        order = list(swarms) if index % 2 == 0 else list(reversed(swarms))
        for label in order:
            if not logs[label].stopped:
                logs[label].kill(swarms[label], index)
    return {label: log.summary() for label, log in logs.items()}


def partitions(swarm: Swarm, rounds: int = PARTITIONS, minority: int = MINORITY) -> dict[str, Any]:
    """Cut `minority` daemons (rotating) from the rest `rounds` times; time each side's verdict."""
    watch, names = swarm.watch, swarm.names
    per_cut: list[dict[str, Any]] = []
    false_deaths: list[str] = []
    for index in range(rounds):
        chosen = {names[(index * minority + k) % len(names)] for k in range(minority)}
        near = [h for h in swarm.hosts if h.name in chosen]
        far = [h for h in swarm.hosts if h.name not in chosen]
        split = Split((tuple(h.name for h in near), tuple(h.name for h in far)))
        cut_at = time.monotonic()
        swarm.cluster.partition(near, far)
        try:
            split.watch(watch, since=cut_at, timeout_s=PARTITION_WAIT_S)
        except WaitTimeoutError:
            pass  # an undecided side shows as None
        finally:
            swarm.cluster.heal()
        healed_at = time.monotonic()
        false_deaths += split.false_deaths
        decided = {side: split.decided_at.get(side) for side in (0, 1)}
        try:
            whole_at: float | None = watch.wait(
                all_alive(names), since=healed_at, timeout_s=REJOIN_WAIT_S, message="healed"
            )
        except WaitTimeoutError:
            whole_at = None
        per_cut.append(
            {
                "minority": sorted(chosen),
                "minority_detect_s": _rounded(None if decided[0] is None else decided[0] - cut_at),
                "majority_detect_s": _rounded(None if decided[1] is None else decided[1] - cut_at),
                "heal_to_all_alive_s": _rounded(None if whole_at is None else whole_at - healed_at),
            }
        )
        if whole_at is None:
            break
    minority_s = [c["minority_detect_s"] for c in per_cut]
    majority_s = [c["majority_detect_s"] for c in per_cut]
    decided_all = all(s is not None for s in minority_s + majority_s)
    worst = max(minority_s) if decided_all and minority_s else None
    return {
        "cuts": len(per_cut),
        "sides": f"{minority}|{len(names) - minority}",
        "minority_detect_max_s": worst,
        "minority_detect_median_s": statistics.median(minority_s) if decided_all else None,
        "majority_detect_max_s": max(majority_s) if decided_all and majority_s else None,
        "false_deaths": false_deaths,
        "per_cut": per_cut,
        "targets": {"minority_detect_max_s": TARGETS["minority_detect_max_s"]},
        "met": {
            "minority": worst is not None and worst <= TARGETS["minority_detect_max_s"],
            "no_false_deaths": not false_deaths,
        },
    }


def _busy_or_error(cluster: NetnsCluster, busy_s: float, tree: Path) -> dict[str, Any]:
    """(d) with `tree`'s daemons; a baseline that does not survive the saturation says how."""
    try:
        return run_busy(cluster, busy_s, tree=tree).to_dict()
    except (AssertionError, WaitTimeoutError) as exc:
        return {"error": str(exc)[:600]}


def run(
    nodes: int = NODES,
    kills: int = KILLS,
    idle_s: float = IDLE_S,
    cuts: int = PARTITIONS,
    busy_s: float = 0.0,
    baseline_tree: Path | None = None,
) -> dict[str, Any]:
    """The measurements: (c) idle cost first, then (a) kills (beside the baseline tree's, when
    given), (b) partitions on the same cluster; (d) a busy member on a cluster of its own."""
    reason = netns_unavailable_reason()
    if reason is not None:
        return {"bench": "membership_netns", "skipped": reason}
    started = time.monotonic()
    result: dict[str, Any] = {
        "bench": "membership_netns",
        "nodes": nodes,
        "setup": "netns hosts on one bridge; default timeouts; inventory + mDNS; secret set; "
        f"probe polls /v1/peers every {PROBE_INTERVAL_S} s",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": os.getloadavg(),
    }
    with ExitStack() as stack:
        swarms = {"this tree": stack.enter_context(running_swarm(nodes))}
        if baseline_tree is not None:
            swarms["baseline tree"] = stack.enter_context(running_swarm(nodes, baseline_tree))
        if baseline_tree is not None:
            result["baseline"] = {"tree": str(baseline_tree)}
        if idle_s:
            result["idle"] = idle_cost(swarms["this tree"], idle_s)
            if baseline_tree is not None:
                result["baseline"]["idle"] = idle_cost(swarms["baseline tree"], idle_s)
        if kills:
            killed = kill_to_dead(swarms, kills)
            result["kill_to_dead"] = killed.pop("this tree")
            if killed:
                result["baseline"]["kill_to_dead"] = killed.popitem()[1]
        if cuts:
            result["partition"] = partitions(swarms["this tree"], cuts)
    if busy_s:
        with NetnsCluster(4) as cluster:
            result["busy"] = run_busy(cluster, busy_s).to_dict()
        if baseline_tree is not None:
            with NetnsCluster(4) as cluster:
                busy = _busy_or_error(cluster, busy_s, baseline_tree)
                result.setdefault("baseline", {"tree": str(baseline_tree)})["busy"] = busy
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["load_average_after"] = os.getloadavg()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--kills", type=int, default=KILLS)
    parser.add_argument("--idle-s", type=float, default=IDLE_S)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--busy-s", type=float, default=0.0, help="(d): saturate this long")
    parser.add_argument("--baseline-tree", type=Path, default=None)
    args = parser.parse_args(argv)
    tree = args.baseline_tree.resolve() if args.baseline_tree else None
    report = run(args.nodes, args.kills, args.idle_s, args.partitions, args.busy_s, tree)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
