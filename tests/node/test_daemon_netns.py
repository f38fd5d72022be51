"""The daemon across hosts: five `shoal serve` processes in network namespaces find each other
(mDNS, inventory, one seed) and see a crash, a graceful stop, a pause and a partition.

Default timeouts throughout. One probe process on a sixth host (never partitioned) polls every
daemon's /v1/peers; each test starts a fresh cluster, so no test depends on another. Times are
printed and recorded (`record_property`); the bounds asserted are generous liveness bounds,
never speed (bench/membership_netns.py measures that).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from config.timeouts import Timeouts
from tests.cluster import Host, NetnsClusterFactory
from tests.node.netns_swarm import (
    Observation,
    Split,
    Swarm,
    all_alive,
    everyone_sees,
    inventory_yaml,
)

pytestmark = pytest.mark.netns
RecordProperty = Callable[[str, object], None]

DAEMONS = 5
TIMEOUTS = Timeouts()
START_S = 30.0
"""Bound on five daemons starting side by side on two cores (wall time, not a measurement)."""
DISCOVERY_S = 30.0
"""Liveness bound from every daemon's HTTP port answering to all 5 alive in every view."""
DEAD_S = 30.0
"""Liveness bound from a crash to dead everywhere (about 2.5 s measured)."""
LEFT_S = 10.0
"""Liveness bound from SIGTERM to left everywhere (about 0.1 s measured: no failure detection)."""
PAUSE_S = TIMEOUTS.probe_timeout_s + TIMEOUTS.indirect_probe_timeout_s + TIMEOUTS.suspicion_s / 2
"""A pause past a failed probe (so the node is suspected when probed early in it) and half a
minimum suspicion short of the earliest possible death: probe + indirect + suspicion."""
PAUSES = 5
"""Pauses at most, until one was long enough for a peer to suspect the paused node."""
AFTER_PAUSE_S = 2.5
PARTITION_DETECT_S = 30.0
"""Liveness bound from the cut to each side seeing all of the other dead (target: 5 s)."""
HEAL_S = 30.0


def _swarm(netns_cluster: NetnsClusterFactory, mode: str) -> Swarm:
    cluster = netns_cluster(DAEMONS + 1)
    hosts, probe_host = cluster.hosts[:DAEMONS], cluster.hosts[DAEMONS]
    inventory = cluster.base_dir / "hosts.yaml"
    inventory.write_text(inventory_yaml(hosts, "shoal"), encoding="utf-8")

    def serve_args(host: Host) -> list[str]:
        if mode == "mdns":
            return ["--node-id", host.name]
        if mode == "inventory":  # the node id comes from the inventory entry of its address
            return ["--no-mdns", "--inventory", str(inventory)]
        assert mode == "seed"
        return ["--no-mdns", "--node-id", host.name, "--seed", hosts[0].endpoint]

    return Swarm(cluster, hosts, probe_host, serve_args)


def _started(netns_cluster: NetnsClusterFactory, mode: str = "inventory") -> Swarm:
    """A fresh swarm of five daemons, all alive at every node."""
    swarm = _swarm(netns_cluster, mode)
    swarm.start_probe()
    swarm.start_all()
    ready = swarm.wait_answering(START_S)
    swarm.watch.wait(
        all_alive(swarm.names), since=ready, timeout_s=START_S, message="all 5 alive everywhere"
    )
    return swarm


@pytest.mark.parametrize("mode", ["mdns", "inventory", "seed"])
def test_five_nodes_discover_each_other(
    netns_cluster: NetnsClusterFactory, mode: str, record_property: RecordProperty
) -> None:
    swarm = _swarm(netns_cluster, mode)
    watch = swarm.start_probe()
    if mode == "seed":
        # The seed is a node that is already up. A node that starts more than ~1 s before its
        # seed gives up after 3 pings and tries again at discovery's next refeed, 10 s later.
        swarm.start(swarm.hosts[0])
        swarm.wait_answering(START_S, [swarm.hosts[0].name])
    swarm.start_all(h for h in swarm.hosts if h.name not in swarm.daemons)
    ready = swarm.wait_answering(START_S)
    found = watch.wait(
        all_alive(swarm.names),
        since=ready,
        timeout_s=DISCOVERY_S,
        message=f"all 5 alive in every view by {mode}",
    )
    elapsed = found - ready
    record_property("discovery_s", round(elapsed, 3))
    print(f"discovery by {mode}: {elapsed:.2f} s after every HTTP port answered")


def test_sigkill_is_dead_at_every_other_node(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm = _started(netns_cluster)
    victim, others = "h2", swarm.others("h2")
    watch = swarm.watch
    killed_at = watch_time()
    swarm.kill(victim)
    dead_at = watch.wait(
        everyone_sees(victim, {"dead"}, others),
        since=killed_at,
        timeout_s=DEAD_S,
        message=f"{victim} dead at {others}",
    )
    elapsed = dead_at - killed_at
    record_property("kill_to_dead_s", round(elapsed, 3))
    print(f"SIGKILL -> dead at every other node: {elapsed:.2f} s")


def test_sigterm_is_left_at_once_at_every_other_node(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm = _started(netns_cluster)
    victim, others = "h2", swarm.others("h2")
    watch = swarm.watch
    seen: list[Observation] = []
    stopped_at = watch_time()
    assert swarm.terminate(victim) == 0
    left_at = watch.wait(
        everyone_sees(victim, {"left"}, others),
        since=stopped_at,
        timeout_s=LEFT_S,
        message=f"{victim} left at {others}",
        on_observation=seen.append,
    )
    elapsed = left_at - stopped_at
    record_property("term_to_left_s", round(elapsed, 3))
    print(f"SIGTERM -> left at every other node: {elapsed:.2f} s")
    # Never suspect or dead on the way: `left` came from the leave, not from failure detection.
    passed_through = {o.state_of(victim) for o in seen if o.host != victim}
    assert not passed_through & {"suspect", "dead"}, passed_through


def test_a_pause_shorter_than_the_dead_timeout_is_refuted_never_dead(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    """SIGSTOP one daemon for PAUSE_S, again until a pause got it suspected (its incarnation
    rises when it refutes): nobody is ever dead or left anywhere, the paused node included once
    it runs again (its own late timers must not condemn its peers)."""
    swarm = _started(netns_cluster)
    victim = "h2"
    watch = swarm.watch
    down: list[Observation] = []
    suspected_by: set[str] = set()

    def check(observation: Observation) -> None:
        if observation.members is None:
            return
        if any(state in ("dead", "left") for state, _ in observation.members.values()):
            down.append(observation)
        if observation.state_of(victim) == "suspect":
            suspected_by.add(observation.host)

    def describe(observations: list[Observation]) -> list[str]:
        return [f"{o.host}@{o.t:.2f}: {dict(o.members or {})}" for o in observations]

    def victim_incarnation() -> int:
        own = watch.latest[victim].members
        assert own is not None, f"{victim} does not answer"
        return own[victim][1]

    daemon = swarm.daemons[victim]
    watch.read()  # only what happens from the first pause on counts
    start = victim_incarnation()
    pauses = 0
    while pauses < PAUSES and victim_incarnation() == start:
        pauses += 1
        daemon.stop()
        try:
            watch.watch_for(PAUSE_S, check)
        finally:
            daemon.cont()
        seen = watch.watch_for(AFTER_PAUSE_S, check)
        assert not down, describe(down)
        assert any(o.host == victim and o.members is not None for o in seen), "no answer"
        watch.wait(
            all_alive(swarm.names),
            since=watch_time(),
            timeout_s=10.0,
            message="all alive after the pause",
            on_observation=check,
        )
        assert not down, describe(down)
    refuted = victim_incarnation() - start
    record_property("pauses", pauses)
    record_property("suspected_by", sorted(suspected_by))
    print(
        f"SIGSTOP {PAUSE_S:.2f} s x {pauses}: never dead; {victim} refuted {refuted} time(s); "
        f"seen suspect at {sorted(suspected_by) or 'no node'}"
    )
    assert refuted > 0, f"{PAUSES} pauses of {PAUSE_S:.2f} s and {victim} was never suspected"


def test_partition_two_three_then_heal(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm = _started(netns_cluster)
    watch = swarm.watch
    minority, majority = swarm.hosts[:2], swarm.hosts[2:]
    cut_at = watch_time()  # before the rules go in: setting them up counts against detection
    swarm.cluster.partition(minority, majority)
    print(f"partition rules in place after {watch_time() - cut_at:.2f} s")

    split = Split((tuple(h.name for h in minority), tuple(h.name for h in majority)))
    split.watch(watch, since=cut_at, timeout_s=PARTITION_DETECT_S)
    assert not split.false_deaths, split.false_deaths
    minority_s = split.decided_at[0] - cut_at
    majority_s = split.decided_at[1] - cut_at
    swarm.cluster.heal()
    healed_at = watch_time()
    whole_at = watch.wait(
        all_alive(swarm.names),
        since=healed_at,
        timeout_s=HEAL_S,
        message="all 5 alive everywhere after the heal",
    )
    record_property("minority_detect_s", round(minority_s, 3))
    record_property("majority_detect_s", round(majority_s, 3))
    record_property("heal_to_alive_s", round(whole_at - healed_at, 3))
    print(
        f"partition 2|3: the minority sees all of the majority dead after {minority_s:.2f} s, "
        f"the majority all of the minority after {majority_s:.2f} s; "
        f"all alive {whole_at - healed_at:.2f} s after the heal"
    )


def watch_time() -> float:
    """Now on the probe's clock (CLOCK_MONOTONIC is shared by every process of the machine)."""
    return time.monotonic()
