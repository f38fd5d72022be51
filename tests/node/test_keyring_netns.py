"""A live gossip-key rotation across hosts: six `shoal serve` processes in network namespaces
(inventory mode, the cluster secret, default timeouts), one crashed before the rotation. The
five others rotate (install, use, remove through `shoal keyring` from a seventh host) while a
probe polls every view: every step exits 0 and no member of the five is ever seen other than
alive. The crashed one comes back with the old key only, names the key it lacks, and rejoins
once given the new one with `--local`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping

import pytest

from tests.cluster import Host, NetnsClusterFactory
from tests.node.netns_swarm import (
    ROOT,
    Condition,
    Observation,
    Swarm,
    all_alive,
    everyone_sees,
    inventory_yaml,
)

pytestmark = pytest.mark.netns

DAEMONS = 6
START_S = 60.0
"""Liveness bound on six daemons starting and finding each other on two shared cores."""
STEP_S = 60.0
"""Liveness bound on one `shoal keyring` command (a subprocess, a forward, a fan-out)."""
HOLD_S = 2.0
"""After each step, every view must hold all five alive this long (several probe rounds)."""
CLUSTER = "shoal"


def _shoal(swarm: Swarm, host: Host, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "node", "keyring", *args]
    if args[0] != "generate":
        argv += ["--config", config]
    return host.run(argv, check=False, timeout_s=STEP_S, env={"PYTHONPATH": str(ROOT)})


def _until_ok(
    swarm: Swarm, host: Host, config: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run a keyring command until it exits 0 (a coordinator may not be elected yet)."""
    deadline = time.monotonic() + STEP_S
    while True:
        done = _shoal(swarm, host, config, *args)
        if done.returncode == 0 or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


def _while_no_coordinator(
    swarm: Swarm, host: Host, config: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run a keyring change again while the node answers that there is no coordinator yet
    (503 not_coordinator: nothing was done; under load an election may still be settling
    after the kill), and only then."""
    deadline = time.monotonic() + STEP_S
    while True:
        done = _shoal(swarm, host, config, *args)
        if "(not_coordinator)" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


def test_rotation_on_five_netns_hosts_and_a_crashed_one_rejoins(
    netns_cluster: NetnsClusterFactory,
) -> None:
    cluster = netns_cluster(DAEMONS + 1)
    hosts, client = cluster.hosts[:DAEMONS], cluster.hosts[DAEMONS]
    inventory = cluster.base_dir / "hosts.yaml"
    inventory.write_text(inventory_yaml(hosts, CLUSTER), encoding="utf-8")
    swarm = Swarm(cluster, hosts, client, lambda h: ["--no-mdns", "--inventory", str(inventory)])
    config = cluster.base_dir / "cli.yaml"
    config.write_text(json.dumps({"secret_file": str(swarm.secret_file), "cluster_name": CLUSTER}))
    names = swarm.names
    rotating, late = names[:5], names[5]
    watch = swarm.start_probe()
    swarm.start_all()
    ready = swarm.wait_answering(START_S)
    watch.wait(all_alive(names), since=ready, timeout_s=START_S, message="six alive")

    swarm.kill(late)
    killed = time.monotonic()
    watch.wait(
        everyone_sees(late, {"dead"}, rotating),
        since=killed,
        timeout_s=START_S,
        message=f"{late} dead",
    )
    node = ["--node", f"http://{hosts[1].endpoint}"]
    listed = _until_ok(swarm, client, str(config), "list", "--json", *node)
    assert listed.returncode == 0, listed.stderr
    first = json.loads(listed.stdout)
    assert [k["in_use_by"] for k in first["keys"]] == [sorted(rotating)]
    old = first["keys"][0]["id"]

    def no_suspicion(view: Observation) -> None:
        if view.host in rotating and view.members is not None:
            bad = {n: s for n, (s, _) in view.members.items() if n in rotating and s != "alive"}
            assert not bad, f"{view.host} saw {bad} during the rotation"

    keyfile = cluster.base_dir / "new.key"
    made = _shoal(swarm, client, str(config), "generate", "--out", str(keyfile))
    assert made.returncode == 0, made.stderr
    new = made.stdout.split()[1]
    for step in (["install", str(keyfile)], ["use", new], ["remove", old]):
        started = time.monotonic()
        done = _while_no_coordinator(swarm, client, str(config), *step, "--json", *node)
        assert done.returncode == 0, f"{step}: {done.stdout}{done.stderr}"
        assert json.loads(done.stdout)["acked"] == sorted(rotating)
        watch.wait(
            _alive_among(rotating),
            since=started,
            timeout_s=STEP_S,
            message=f"five alive after {step[0]}",
            hold_s=HOLD_S,
            on_view=no_suspicion,
        )
    listed = json.loads(_shoal(swarm, client, str(config), "list", "--json", *node).stdout)
    assert listed["keys"] == [{"id": new, "members": 5, "in_use_by": sorted(rotating)}]

    back = swarm.start(swarm.host(late))
    deadline = time.monotonic() + START_S
    lacked = f"sealed with gossip key {new}, which this node lacks"
    while lacked not in back.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{late} never named {new}: {back.log_tail(20)}"
        time.sleep(0.2)
    here = ["--local", "--node", f"http://{swarm.host(late).endpoint}"]
    given = _until_ok(swarm, client, str(config), "install", str(keyfile), *here)
    assert given.returncode == 0, given.stderr
    used = _shoal(swarm, client, str(config), "use", new, *here)
    assert used.returncode == 0, used.stderr
    rejoined = time.monotonic()
    watch.wait(all_alive(names), since=rejoined, timeout_s=START_S, message=f"{late} rejoined")


def _alive_among(names: tuple[str, ...]) -> Condition:
    def check(views: Mapping[str, Observation]) -> bool:
        return all(
            views.get(name) is not None
            and all(views[name].state_of(other) == "alive" for other in names)
            for name in names
        )

    return check
