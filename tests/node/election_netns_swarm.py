"""Five voting shoal daemons on a netns cluster and one probe of their election.

`start_voters` writes the inventory (every daemon a voter), one config file per daemon (its
timeouts, its adoption log) and starts the daemons and `election_netns_probe.py` on a host of its
own; `ElectionWatch` reads the probe's output as it grows and waits for conditions on the
daemons' views. Used by tests/node/test_election_netns.py, test_groups_netns.py and
bench/election_bench.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.election.adoption import AdoptionRecord, check_adoption_logs, read_adoption_log
from tests.cluster import Host, NetnsCluster
from tests.node.netns_swarm import ProbeWatch, Swarm

__all__ = [
    "FAST_TIMEOUTS",
    "START_S",
    "Condition",
    "ElectionWatch",
    "Fence",
    "PlanView",
    "Views",
    "adoption_problems",
    "agreed",
    "converged",
    "coordinator_of",
    "read_logs",
    "start_voters",
]

PROBE = Path(__file__).with_name("election_netns_probe.py")
ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.02
START_S = 40.0
"""Bound on five daemons starting and electing side by side on two loaded cores."""

FAST_TIMEOUTS: Mapping[str, float] = {
    "heartbeat_interval_s": 0.1,
    "lease_s": 0.6,
    "election_min_s": 0.6,
    "election_max_s": 1.2,
    "probe_interval_s": 0.2,
    "probe_timeout_s": 0.1,
    "indirect_probe_timeout_s": 0.2,
    "suspicion_s": 0.4,
}
"""Shrunk election and membership timing (config file `timeouts:`) for the chaos schedule."""

Fence = tuple[int, int]


@dataclass(frozen=True)
class PlanView:
    """One answer of GET /v1/plan from the daemon on `host` at probe time `t` (or `error`)."""

    t: float
    host: str
    term: int | None = None
    coordinator: str | None = None
    lease_valid: bool = False
    plan: Fence | None = None
    ranks: tuple[str, ...] | None = None
    nodes: tuple[str, ...] | None = None
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.error is None


Views = Mapping[str, PlanView]
Condition = Callable[[Views], bool]


def coordinator_of(views: Views, names: Iterable[str]) -> tuple[str, int] | None:
    """(coordinator, term) when every one of `names` answers and all name the same coordinator
    in the same term with a valid lease (the coordinator's own, or heard within it)."""
    seen = [views.get(name) for name in names]
    if not seen or any(v is None or not v.answered or not v.lease_valid for v in seen):
        return None
    found = {(v.coordinator, v.term) for v in seen if v is not None}
    if len(found) != 1:
        return None
    coordinator, term = found.pop()
    if coordinator is None or term is None:
        return None
    return coordinator, term


def agreed(
    names: Iterable[str], *, above_term: int = -1, not_coordinator: str | None = None
) -> Condition:
    """Every daemon of `names` follows one coordinator with a live lease, in a term above
    `above_term`, other than `not_coordinator`."""
    wanted = tuple(names)

    def check(views: Views) -> bool:
        found = coordinator_of(views, wanted)
        return found is not None and found[1] > above_term and found[0] != not_coordinator

    return check


def converged(
    names: Iterable[str], *, at_least: Fence | None = None, above_term: int = -1
) -> Condition:
    """`agreed(names, above_term=...)` and every one of them applies the same plan, at least
    `at_least`, made in the coordinator's term, giving a role to exactly `names`."""
    wanted = tuple(names)
    leader = agreed(wanted, above_term=above_term)

    def check(views: Views) -> bool:
        if not leader(views):
            return False
        plans = {(views[name].plan, views[name].nodes) for name in wanted}
        if len(plans) != 1:
            return False
        fence, nodes = plans.pop()
        return (
            fence is not None
            and fence[0] == views[wanted[0]].term
            and (at_least is None or fence >= at_least)
            and set(nodes or ()) == set(wanted)
        )

    return check


class ElectionWatch(ProbeWatch[PlanView]):
    """The election view of every daemon (GET /v1/plan through election_netns_probe.py)."""

    def parse(self, host: str, record: Mapping[str, Any]) -> PlanView:
        if "error" in record:
            return PlanView(record["t"], host, error=str(record["error"]))
        plan = record.get("plan")
        ranks, nodes = record.get("ranks"), record.get("nodes")
        return PlanView(
            t=record["t"],
            host=host,
            term=record["term"],
            coordinator=record["coordinator"],
            lease_valid=bool(record["lease_valid"]),
            plan=None if plan is None else (int(plan[0]), int(plan[1])),
            ranks=None if ranks is None else tuple(ranks),
            nodes=None if nodes is None else tuple(nodes),
        )

    def describe_view(self, view: PlanView) -> str:
        if view.error is not None:
            return view.error
        lease = "lease" if view.lease_valid else "no lease"
        plan = "-" if view.plan is None else f"{view.plan[0]}.{view.plan[1]}"
        return f"term {view.term} coord {view.coordinator} ({lease}) {plan}"


def inventory_text(hosts: Sequence[Host], cluster_name: str) -> str:
    """An inventory listing `hosts` by name at their address and port, all of them voters."""
    voters = ", ".join(h.name for h in hosts)
    lines = [f"cluster: {{name: {cluster_name}, voters: [{voters}]}}", "hosts:"]
    lines += [f"  {h.name}: {{ssh_host: {h.address}, p2p_port: {h.port}}}" for h in hosts]
    return "\n".join(lines) + "\n"


def adoption_log_path(host: Host) -> Path:
    return host.data_dir / "adoption.jsonl"


def start_voters(
    cluster: NetnsCluster,
    daemons: int,
    *,
    timeouts: Mapping[str, float] | None = None,
    settings: Mapping[str, object] | None = None,
    probe_interval_s: float = 0.05,
    tree: Path = ROOT,
) -> tuple[Swarm, ElectionWatch]:
    """Start `daemons` voters on the first hosts of `cluster` and the probe on the next host.

    Each daemon gets `--inventory` (all of them voters), `--no-mdns`, `--node-id` and a config
    file with `timeouts`, `settings` and its `adoption_log`; the daemons run `tree`'s code.
    Returns at once: wait on the watch.
    """
    hosts, probe_host = cluster.hosts[:daemons], cluster.hosts[daemons]
    inventory = cluster.base_dir / "hosts.yaml"
    inventory.write_text(inventory_text(hosts, "shoal"), encoding="utf-8")
    for host in hosts:
        config: dict[str, object] = {
            **(settings or {}),
            "adoption_log": str(adoption_log_path(host)),
        }
        if timeouts:
            config["timeouts"] = dict(timeouts)
        # JSON is YAML: one line, no quoting surprises.
        config_path(host).write_text(json.dumps(config) + "\n", encoding="utf-8")

    def serve_args(host: Host) -> list[str]:
        return [
            "--no-mdns",
            "--node-id", host.name,
            "--inventory", str(inventory),
            "--config", str(config_path(host)),
        ]  # fmt: skip

    swarm = Swarm(cluster, hosts, probe_host, serve_args, tree=tree)
    argv = [
        sys.executable, str(PROBE),
        "--secret-file", str(swarm.secret_file),
        "--interval-s", str(probe_interval_s),
        "--timeout-s", "0.5",
        *(h.endpoint for h in hosts),
    ]  # fmt: skip
    probe = probe_host.spawn(argv, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, name="probe")
    watch = ElectionWatch(probe, hosts)
    watch.guard = swarm.check_daemons
    swarm.start_all()
    return swarm, watch


def config_path(host: Host) -> Path:
    return host.cluster.base_dir / f"{host.name}.yaml"


def read_logs(hosts: Iterable[Host]) -> dict[str, list[AdoptionRecord]]:
    """Every host's adoption log (empty for a host that never adopted anything)."""
    logs: dict[str, list[AdoptionRecord]] = {}
    for host in hosts:
        path = adoption_log_path(host)
        logs[host.name] = read_adoption_log(path) if path.exists() else []
    return logs


def adoption_problems(
    logs: Mapping[str, Sequence[AdoptionRecord]], voters: Sequence[str]
) -> list[str]:
    """`check_adoption_logs`, plus: every plan any node adopted was published by its term's
    coordinator with a majority of the voters behind it (the publisher's own record)."""
    problems = check_adoption_logs(logs, voters)
    quorum = len(voters) // 2 + 1
    published: dict[tuple[int, int], AdoptionRecord] = {}
    for node, records in logs.items():
        for record in records:
            publisher = record.backers is not None and record.coordinator == node
            if record.kind == "plan" and publisher and record.plan_term is not None:
                published[(record.plan_term, record.plan_version or 0)] = record
    for node, records in sorted(logs.items()):
        for record in records:
            if record.kind != "plan" or record.plan_term is None or record.plan_version is None:
                continue
            fence = (record.plan_term, record.plan_version)
            source = published.get(fence)
            if source is None:
                problems.append(
                    f"{node}: adopted plan {fence[0]}.{fence[1]} that no coordinator logged "
                    "publishing"
                )
            elif len(set(source.backers or ()) & set(voters)) < quorum:
                problems.append(
                    f"{node}: adopted plan {fence[0]}.{fence[1]} published by "
                    f"{source.node} with only {source.backers} behind it"
                )
            elif source.plan_digest != record.plan_digest:
                problems.append(f"{node}: plan {fence[0]}.{fence[1]} differs from the published")
    return problems
