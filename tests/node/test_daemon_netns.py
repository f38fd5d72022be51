"""The daemon across hosts: five `shoal serve` processes in network namespaces find each other
(mDNS, inventory, one seed) and see a crash, a graceful stop, a pause and a partition.

Default timeouts throughout: a 1 s pause must stay below the failure detector's threshold. One
probe process on a sixth host (never partitioned) polls every daemon's /v1/peers; each test
starts a fresh cluster, so no test depends on another.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.cluster import Host, NetnsClusterFactory
from tests.node.netns_swarm import (
    Observation,
    Swarm,
    Views,
    all_alive,
    everyone_sees,
    inventory_yaml,
)

pytestmark = pytest.mark.netns
RecordProperty = Callable[[str, object], None]

DAEMONS = 5
START_S = 30.0
"""Bound on five daemons starting side by side on two cores (wall time, not a measurement)."""
DISCOVERY_S = 3.0
"""From the moment every daemon's HTTP port answers to all 5 alive in every view."""
DEAD_S = 10.0
LEFT_S = 1.0
PAUSE_S = 1.0
AFTER_PAUSE_S = 2.5
PARTITION_DETECT_S = 15.0
HEAL_S = 20.0


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
        timeout_s=DISCOVERY_S + 5.0,
        message=f"all 5 alive in every view by {mode}",
    )
    elapsed = found - ready
    record_property("discovery_s", round(elapsed, 3))
    print(f"discovery by {mode}: {elapsed:.2f} s after every HTTP port answered")
    assert elapsed <= DISCOVERY_S, f"{mode}: {elapsed:.2f} s > {DISCOVERY_S} s"


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
        timeout_s=DEAD_S + 2.0,
        message=f"{victim} dead at {others}",
    )
    elapsed = dead_at - killed_at
    record_property("kill_to_dead_s", round(elapsed, 3))
    print(f"SIGKILL -> dead at every other node: {elapsed:.2f} s")
    assert elapsed <= DEAD_S


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
        timeout_s=LEFT_S + 5.0,
        message=f"{victim} left at {others}",
        on_observation=seen.append,
    )
    elapsed = left_at - stopped_at
    record_property("term_to_left_s", round(elapsed, 3))
    print(f"SIGTERM -> left at every other node: {elapsed:.2f} s")
    assert elapsed <= LEFT_S
    passed_through = {o.state_of(victim) for o in seen if o.host != victim}
    assert not passed_through & {"suspect", "dead"}, passed_through


def test_sigstop_for_one_second_is_never_dead(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm = _started(netns_cluster)
    victim = "h2"
    watch = swarm.watch
    down: list[Observation] = []
    suspected_by: set[str] = set()

    def check(observation: Observation) -> None:
        # Stronger than the victim never dead: nobody is dead or left anywhere, the paused node
        # included once it runs again (its own late timers must not condemn its peers).
        if observation.members is None:
            return
        if any(state in ("dead", "left") for state, _ in observation.members.values()):
            down.append(observation)
        if observation.state_of(victim) == "suspect":
            suspected_by.add(observation.host)

    def describe(observations: list[Observation]) -> list[str]:
        return [f"{o.host}@{o.t:.2f}: {dict(o.members or {})}" for o in observations]

    daemon = swarm.daemons[victim]
    watch.read()  # only what happens from the pause on counts
    daemon.stop()
    try:
        watch.watch_for(PAUSE_S, check)
    finally:
        daemon.cont()
    seen = watch.watch_for(AFTER_PAUSE_S, check)
    assert not down, describe(down)
    assert any(o.host == victim and o.members is not None for o in seen), "no answer after SIGCONT"
    watch.wait(
        all_alive(swarm.names),
        since=watch_time(),
        timeout_s=5.0,
        message="all alive after the pause",
        on_observation=check,
    )
    assert not down, describe(down)
    record_property("suspected_by", sorted(suspected_by))
    print(f"SIGSTOP 1 s: never dead; suspect meanwhile at {sorted(suspected_by) or 'no node'}")


def test_partition_two_three_then_heal(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm = _started(netns_cluster)
    watch = swarm.watch
    minority, majority = swarm.hosts[:2], swarm.hosts[2:]
    swarm.cluster.partition(minority, majority)
    cut_at = watch_time()

    def split(views: Views) -> bool:
        # The majority sees the minority dead, and each minority node has declared a majority
        # node dead. (All of the majority dead at the minority takes up to ~10 s: its failed
        # probes get no nacks from relays across the cut, so Lifeguard slows its probing.)
        minority_dead = all(
            everyone_sees(host.name, {"dead"}, [h.name for h in majority])(views)
            for host in minority
        )
        return minority_dead and all(
            host.name in views
            and any(views[host.name].state_of(h.name) == "dead" for h in majority)
            for host in minority
        )

    apart_at = watch.wait(
        split,
        since=cut_at,
        timeout_s=PARTITION_DETECT_S,
        message="the majority sees the minority dead and the minority some of the majority",
    )
    swarm.cluster.heal()
    healed_at = watch_time()
    whole_at = watch.wait(
        all_alive(swarm.names),
        since=healed_at,
        timeout_s=HEAL_S,
        message="all 5 alive everywhere after the heal",
    )
    record_property("partition_detect_s", round(apart_at - cut_at, 3))
    record_property("heal_to_alive_s", round(whole_at - healed_at, 3))
    print(
        f"partition: split seen after {apart_at - cut_at:.2f} s; "
        f"all alive {whole_at - healed_at:.2f} s after the heal"
    )


def watch_time() -> float:
    """Now on the probe's clock (CLOCK_MONOTONIC is shared by every process of the machine)."""
    return time.monotonic()
