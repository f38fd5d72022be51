"""Release N with release N-1 on netns hosts: the previous release's tree (the commit in
PREVIOUS_RELEASE, checked out with `git worktree` at test time, run with this interpreter) and
this tree in one cluster, 2 old + 3 new, then 3 old + 2 new. In each: membership converges at
every node, a coordinator is elected and replaced after a SIGKILL, games and `models` files
sync from old to new and from new to old, a gang job started through an old node and one
started through a new node each span every node, and cluster_monitor lists both releases."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from config import HEADER_VERSION, PROTOCOL_VERSION, version_header
from tests.cluster import ClusterProcess, Host, NetnsCluster, NetnsClusterFactory
from tests.compat.previous import OLD_RELEASE, ROOT, OldTree, previous_tree
from tests.node.election_netns_swarm import (
    PROBE,
    ElectionWatch,
    agreed,
    converged,
    coordinator_of,
    inventory_text,
)
from tests.node.netns_swarm import Swarm

pytestmark = pytest.mark.netns
CLIENT = Path(__file__).with_name("compat_client.py")
NODES = 5
START_S = 40.0
"""Bound on five daemons of two trees starting and electing side by side on two loaded cores."""
FAILOVER_S = 20.0
CLIENT_S = 60.0
CONFIG = {"sync_interval_s": 0}


@pytest.fixture(scope="module")
def old_tree() -> Iterator[OldTree]:
    """The previous release checked out into a temporary directory, removed afterwards. Skips
    (fails under CI's flag) without netns, git or the commit."""
    with previous_tree() as tree:
        yield tree


class MixedSwarm(Swarm):
    """A Swarm whose daemons in `old` run the previous release's tree."""

    def __init__(
        self, cluster: NetnsCluster, hosts: Sequence[Host], probe_host: Host, old: set[str],
        tree: OldTree,
    ) -> None:  # fmt: skip
        inventory = cluster.base_dir / "hosts.yaml"
        inventory.write_text(inventory_text(hosts, "shoal"), encoding="utf-8")
        config = cluster.base_dir / "node.yaml"
        config.write_text(json.dumps(CONFIG) + "\n", encoding="utf-8")

        def serve_args(host: Host) -> list[str]:
            return [
                "--no-mdns", "--node-id", host.name,
                "--inventory", str(inventory), "--config", str(config),
            ]  # fmt: skip

        super().__init__(cluster, hosts, probe_host, serve_args)
        self.old = old
        self.tree = tree

    def start(self, host: Host) -> ClusterProcess:
        if host.name in self.old:
            cwd, path, name = self.tree.root, self.tree.pythonpath, "shoal-old"
        else:
            cwd, path, name = ROOT, str(ROOT), "shoal-new"
        # `python -m` puts the working directory first on sys.path: each tree runs its own code
        proc = host.spawn(self.argv(host), cwd=cwd, env={"PYTHONPATH": path}, name=name)
        self.daemons[host.name] = proc
        self.down.discard(host.name)
        return proc


def _url(host: Host) -> str:
    return f"http://{host.address}:{host.port}"


def _run_mixed(cluster: NetnsCluster, tree: OldTree, olds: int) -> None:
    hosts, probe_host = cluster.hosts[:NODES], cluster.hosts[NODES]
    old = {h.name for h in hosts[:olds]}
    for host in hosts:  # one checkpoint per node, to travel both ways
        checkpoint = host.data_dir / "models" / host.name / "step-1.pt"
        checkpoint.parent.mkdir(parents=True)
        checkpoint.write_bytes(host.name.encode() * 1000)
    swarm = MixedSwarm(cluster, hosts, probe_host, old, tree)
    argv = [
        sys.executable, str(PROBE), "--secret-file", str(swarm.secret_file),
        "--interval-s", "0.1", "--timeout-s", "0.5", *(h.endpoint for h in hosts),
    ]  # fmt: skip
    probe = probe_host.spawn(argv, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, name="probe")
    watch = ElectionWatch(probe, hosts)
    watch.guard = swarm.check_daemons
    swarm.start_all()
    watch.wait(
        converged(swarm.names),
        since=0.0,
        timeout_s=START_S,
        message=f"one coordinator and one plan for all {NODES} ({sorted(old)} old)",
    )
    leader, term = coordinator_of(watch.matched, swarm.names) or ("?", -1)

    new = [name for name in swarm.names if name not in old]
    nodes = {h.name: _url(h) for h in hosts}
    client = [
        sys.executable, str(CLIENT), "--secret-file", str(swarm.secret_file),
        "--nodes", json.dumps(nodes), "--old", ",".join(sorted(old)),
        "--gang-via", f"{new[-1]},{sorted(old)[-1]}", "--timeout-s", str(CLIENT_S),
    ]  # fmt: skip
    done = probe_host.run(client, timeout_s=CLIENT_S * 2 + 30, env={"PYTHONPATH": str(ROOT)})
    result = json.loads(done.stdout.strip().splitlines()[-1])

    for observer, view in result["views"].items():
        for member in swarm.names:
            state, release, protocol, meta_protocol = view[member]
            assert state == "alive", (observer, member, view)
            if observer in old and release is None and meta_protocol is None:
                continue  # the previous release's first-contact gap (see fills_meta): no meta
            # an old node passes on the meta key it does not know
            assert meta_protocol == (None if member in old else PROTOCOL_VERSION), (observer, view)
            if member in old:
                assert release == OLD_RELEASE, (observer, member, view)
            if observer not in old:  # a new node reads an old member's meta as protocol 1
                assert protocol == (1 if member in old else PROTOCOL_VERSION), (observer, view)
    for node, seen in result["versions"].items():
        if node in old:
            assert seen["header"] is None, seen
            assert seen["version"] == OLD_RELEASE, seen
        else:
            assert seen["header"] == version_header(seen["release"]), (HEADER_VERSION, seen)
            assert seen["protocol"] == PROTOCOL_VERSION, seen

    monitor = [
        sys.executable, "-m", "health.cluster_monitor", "--node", nodes[new[0]],
        "--secret-file", str(swarm.secret_file), "--json", "--once",
    ]  # fmt: skip
    shown = probe_host.run(monitor, check=False, env={"PYTHONPATH": str(ROOT), "SHOAL_CONFIG": ""})
    summary = json.loads(shown.stdout)["summary"]
    release = result["versions"][new[0]]["release"]
    assert summary["releases"] == {OLD_RELEASE: sorted(old), release: sorted(new)}, summary
    assert summary["release_warning"] is None, summary

    first_old, first_new = sorted(old)[0], new[0]
    expected = sorted(f"{node}-g{i}" for node in (first_old, first_new) for i in range(5))
    assert result["records"] == {first_old: expected, first_new: expected}, result["syncs"]
    for puller, source in ((first_old, first_new), (first_new, first_old)):
        copy = swarm.host(puller).data_dir / "models" / source / "step-1.pt"
        assert copy.read_bytes() == source.encode() * 1000, result["syncs"][puller]

    for via, gang in result["gangs"].items():
        assert gang["start"][0] == 201, (via, gang["start"])
        ended = gang["ended"]
        assert ended["state"] == "succeeded", (via, ended)
        assert sorted(m["node"] for m in ended["gang"]["members"]) == sorted(swarm.names)
        ranks = sorted(text.split()[1] for text in gang["logs"].values())
        assert ranks == [str(rank) for rank in range(NODES)], (via, gang["logs"])

    swarm.kill(leader)
    rest = swarm.others(leader)
    watch.wait(
        agreed(rest, above_term=term, not_coordinator=leader),
        since=0.0,
        timeout_s=FAILOVER_S,
        message=f"a coordinator other than the killed {leader} (term > {term})",
    )


@pytest.mark.timeout(200)
@pytest.mark.parametrize("olds", [2, 3], ids=["2-old-3-new", "3-old-2-new"])
def test_previous_and_current_release_run_one_cluster(
    netns_cluster: NetnsClusterFactory, old_tree: OldTree, olds: int
) -> None:
    _run_mixed(netns_cluster(NODES + 1), old_tree, olds)
