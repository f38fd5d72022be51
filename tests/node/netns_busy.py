"""A busy member on a netns cluster: three daemons, the link of the first limited with `tc` and
saturated both ways by their background sync (its peers pull its checkpoint while it pulls the
third's), watched for false deaths; then the busy member is SIGKILLed while its link is still
full and timed until dead at both peers.

Used by tests/node/test_membership_busy_netns.py (a short saturation) and
bench/membership_netns.py `--busy-s` (60 s).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster import Host, NetnsCluster
from tests.node.netns_swarm import Observation, Swarm, all_alive, everyone_sees, inventory_yaml

ROOT = Path(__file__).resolve().parents[2]
FETCH = Path(__file__).with_name("netns_fetch.py")
RATE_MBIT = 20.0
QUEUE_MS = 1000
CONGESTION = "reno"
"""A loss-based sender, as Linux's default cubic (a namespace may pick only the congestion
controls the machine allows, reno and bbr here), fills the bottleneck's buffer; bbr keeps it
nearly empty and the test would prove little."""
"""The FIFO at the switch's port toward the busy member: a second of bufferbloat."""
START_S = 60.0
SYNC_START_S = 60.0
"""Bound on the peers' first sync round reaching the busy member's checkpoint (wall time)."""
DEAD_WAIT_S = 30.0
"""Liveness bound from the SIGKILL to dead at both peers (a measurement, not a target)."""
PROBE_TIMEOUT_S = 2.0
"""The probe's answers from the busy member wait behind its bulk traffic (HTTP is not marked)."""
_SENT = re.compile(r"qdisc tbf 1: .*?Sent (\d+) bytes", re.DOTALL)
_EVENT = re.compile(r'^shoal_membership_events_total\{kind="(\w+)"\} ([0-9.e+]+)$', re.MULTILINE)


def checkpoint_mib(saturate_s: float) -> int:
    """A checkpoint that keeps the limited link busy for `saturate_s` and the kill after it."""
    return int((saturate_s + 20.0) * RATE_MBIT / 8 * 1.2) + 8


def write_checkpoint(path: Path, mib: int) -> None:
    """`mib` MiB of random bytes (pieces that differ, so none is copied from another)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for _ in range(mib):
            out.write(os.urandom(1 << 20))


def _sent(argv: list[str]) -> int:
    text = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    found = _SENT.search(text)
    return int(found.group(1)) if found else 0


def shaped_bytes(cluster: NetnsCluster, host: Host) -> tuple[int, int]:
    """Bytes the shapers of `host`'s link have passed: (sent by it, sent to it)."""
    port = f"h{cluster.hosts.index(host)}"
    up = _sent(["tc", "-n", str(host.ns), "-s", "qdisc", "show", "dev", "eth0"])
    down = _sent(["tc", "-n", cluster.switch_ns, "-s", "qdisc", "show", "dev", port])
    return up, down


@dataclass
class BusyReport:
    """What one saturation showed: how busy the link was, every membership change counted by
    each daemon (before the kill), live members seen dead by the probe, and the kill."""

    saturated_s: float = 0.0
    mib: tuple[float, float] = (0.0, 0.0)
    utilisation: tuple[float, float] = (0.0, 0.0)
    """Of the busy member's link: (uplink, downlink)."""
    events: dict[str, dict[str, float]] = field(default_factory=dict)
    seen_dead: list[str] = field(default_factory=list)
    seen_suspect: int = 0
    kill_to_dead_s: dict[str, float] = field(default_factory=dict)

    @property
    def false_deaths(self) -> int:
        return int(sum(kinds.get("dead", 0) for kinds in self.events.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "saturated_s": round(self.saturated_s, 1),
            "link_mib": {"up": round(self.mib[0], 1), "down": round(self.mib[1], 1)},
            "link_utilisation": {
                "up": round(self.utilisation[0], 3),
                "down": round(self.utilisation[1], 3),
            },
            "membership_events_before_kill": self.events,
            # None: the daemons count no membership events (a release before the metric)
            "false_deaths": self.false_deaths if any(self.events.values()) else None,
            "seen_dead_by_probe": self.seen_dead[:20],
            "suspect_sightings": self.seen_suspect,
            "kill_to_dead_s": {k: round(v, 2) for k, v in self.kill_to_dead_s.items()},
        }


class BusyCluster:
    """The three daemons and the probe, on the first four hosts of `cluster`."""

    def __init__(
        self,
        cluster: NetnsCluster,
        timeouts: Mapping[str, float] | None = None,
        tree: Path = ROOT,
    ) -> None:
        self.cluster = cluster
        hosts, probe_host = cluster.hosts[:3], cluster.hosts[3]
        self.busy, self.peers = hosts[0], hosts[1:]
        inventory = cluster.base_dir / "hosts.yaml"
        inventory.write_text(inventory_yaml(hosts, "shoal"), encoding="utf-8")
        config: dict[str, object] = {"sync_interval_s": 1.0}
        if timeouts:
            config["timeouts"] = dict(timeouts)
        config_file = cluster.base_dir / "busy.yaml"
        config_file.write_text(json.dumps(config) + "\n", encoding="utf-8")

        def serve_args(host: Host) -> list[str]:
            return ["--no-mdns", "--inventory", str(inventory), "--config", str(config_file)]

        self.swarm = Swarm(cluster, hosts, probe_host, serve_args, tree=tree)

    def start(self, checkpoint_mib: int) -> None:
        """Write a checkpoint on the busy member and one on the third host (for the busy one to
        pull), start everyone and wait until all are alive."""
        for host in (self.busy, self.peers[-1]):
            write_checkpoint(host.data_dir / "models" / f"{host.name}.ckpt", checkpoint_mib)
        for host in (self.busy, *self.peers):
            host.run(["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={CONGESTION}"])
        swarm = self.swarm
        swarm.start_probe(timeout_s=PROBE_TIMEOUT_S)
        swarm.start_all()
        ready = swarm.wait_answering(START_S)
        swarm.watch.wait(all_alive(swarm.names), since=ready, timeout_s=START_S, message="alive")

    def saturate(self) -> None:
        """Limit the busy member's link and wait until its peers' pulls fill it."""
        self.cluster.limit_rate(self.busy, RATE_MBIT, queue_ms=QUEUE_MS)
        deadline = time.monotonic() + SYNC_START_S
        while min(shaped_bytes(self.cluster, self.busy)) < 4 << 20:
            if time.monotonic() > deadline:
                raise AssertionError(f"no sync filled {self.busy.name}'s link")
            self.swarm.check_daemons()
            time.sleep(0.2)

    def watch(self, seconds: float, report: BusyReport) -> None:
        """Watch the views for `seconds` of saturation; count the link's bytes."""
        names = set(self.swarm.names)
        started, before = time.monotonic(), shaped_bytes(self.cluster, self.busy)

        def note(view: Observation) -> None:
            for member, (state, _) in (view.members or {}).items():
                if member in names and state == "dead":
                    report.seen_dead.append(f"{view.host}@{view.t:.2f} sees {member} dead")
                report.seen_suspect += member in names and state == "suspect"

        self.swarm.watch.watch_for(seconds, note)
        report.saturated_s = time.monotonic() - started
        after = shaped_bytes(self.cluster, self.busy)
        up, down = after[0] - before[0], after[1] - before[1]
        report.mib = (up / (1 << 20), down / (1 << 20))
        capacity = RATE_MBIT * 1e6 / 8 * report.saturated_s
        report.utilisation = (up / capacity, down / capacity)
        report.events = self.event_counts()

    def event_counts(self) -> dict[str, dict[str, float]]:
        """Every daemon's `shoal_membership_events_total` by kind, read from /metrics."""
        argv = [
            sys.executable, str(FETCH), "--secret-file", str(self.swarm.secret_file),
            "--timeout-s", "10", "/metrics", *(h.endpoint for h in self.swarm.hosts),
        ]  # fmt: skip
        probe_host = self.swarm.probe_host
        lines = probe_host.run(argv, env={"PYTHONPATH": str(ROOT)}, timeout_s=30.0).stdout
        names = {h.endpoint: h.name for h in self.swarm.hosts}
        counts: dict[str, dict[str, float]] = {}
        for line in lines.splitlines():
            answer = json.loads(line)
            text = answer.get("text")
            if text is None:
                raise AssertionError(f"no metrics from {answer['target']}: {answer['error']}")
            found = {kind: float(value) for kind, value in _EVENT.findall(text)}
            counts[names[answer["target"]]] = found
        return counts

    def kill_busy(self, report: BusyReport) -> None:
        """SIGKILL the busy member while its link is still full; time dead at each peer."""
        busy, peers = self.busy.name, [h.name for h in self.peers]
        killed_at = time.monotonic()

        def note(view: Observation) -> None:
            if view.t >= killed_at and view.host in peers and view.state_of(busy) == "dead":
                report.kill_to_dead_s.setdefault(view.host, view.t - killed_at)

        self.swarm.kill(busy)
        self.swarm.watch.wait(
            everyone_sees(busy, {"dead"}, peers),
            since=killed_at,
            timeout_s=DEAD_WAIT_S,
            message=f"{busy} dead at {peers}",
            on_observation=note,
        )

    def unlimit(self) -> None:
        self.cluster.unlimit_rate(self.busy)


def run_busy(
    cluster: NetnsCluster,
    saturate_s: float,
    timeouts: Mapping[str, float] | None = None,
    tree: Path = ROOT,
) -> BusyReport:
    """The whole scenario on `cluster` (4 hosts or more), the daemons running `tree`'s code;
    the link is unlimited at the end, even on failure."""
    busy = BusyCluster(cluster, timeouts, tree)
    report = BusyReport()
    busy.start(checkpoint_mib(saturate_s))
    try:
        busy.saturate()
        busy.watch(saturate_s, report)
        busy.kill_busy(report)
    finally:
        busy.unlimit()
    return report
