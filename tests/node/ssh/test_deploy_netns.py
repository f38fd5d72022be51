"""`shoal deploy` to three netns hosts with real sshds: from a clean state the daemons answer
/v1/health and see each other; a second run is `unchanged` with the same pids; `--dry-run`
writes nothing; a rolling upgrade (a changed inventory) restarts them one at a time, the
coordinator last, each back in the cluster before the next, and records each in its audit
trail; a roll whose first host does not come back stops there with its log lines and leaves
the others running; `undeploy` stops the daemon and keeps the data dir."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from config import load_inventory, signing_middleware
from node.providers import ReadyNode, ready_node
from node.ssh import SSHExecutor
from node.ssh.cluster import HttpClusterProbe
from node.ssh.deploy import DeployResult, deploy, desired_for_hosts, undeploy_host
from node.ssh.plan import INSTALLED, REMOVED, UNCHANGED, UPGRADED
from node.ssh.rolling import (
    STOPPED,
    UNTOUCHED,
    UPGRADED_AND_SETTLED,
    RollingReport,
    agreed_coordinator,
    probe_all,
    rolling_order,
    rolling_upgrade,
)
from node.ssh.upgrader import SshUpgrader
from tests.cluster.fixtures import NetnsClusterFactory
from tests.cluster.sshd import (
    make_client_key,
    requires_sshd,
    run_in_namespace,
    start_sshd,
)
from tests.cluster.waiting import wait_until

pytestmark = [
    pytest.mark.netns,
    requires_sshd(),
]
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
STEP_TIMEOUT_S = 240.0


@pytest.mark.timeout(900)
def test_deploy_three_hosts_then_unchanged_then_rolling_then_undeploy(
    netns_cluster: NetnsClusterFactory, tmp_path: Path
) -> None:
    cluster = netns_cluster(4)
    operator, *targets = cluster.hosts
    key = make_client_key(tmp_path / "client")
    servers = [start_sshd(tmp_path / f"sshd-{h.name}", [key.public_line], host=h) for h in targets]
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(s.known_hosts_line() for s in servers) + "\n")
    secret_path = tmp_path / "secret"
    secret_path.write_text("deploy-test-secret-0123456789abcdef\n")
    secret_path.chmod(0o600)
    roots = {h.name: tmp_path / "targets" / h.name for h in targets}
    inventory_path = tmp_path / "inventory.yaml"
    inventory_document = {
        "cluster": {"name": "deploytest"},
        "hosts": {
            h.name: {
                "ssh_host": h.address,
                "internal_ip": h.address,
                "ssh_user": "root",
                "ssh_key": str(key.path),
                "path": str(roots[h.name]),
                "p2p_port": h.port,
            }
            for h in targets
        },
    }
    inventory_path.write_text(yaml.safe_dump(inventory_document))
    inventory = load_inventory(inventory_path)
    names = [h.name for h in targets]
    secret = b"deploy-test-secret-0123456789abcdef"

    def run_deploy(dry_run: bool) -> dict[str, DeployResult]:
        async def go() -> dict[str, DeployResult]:
            async with (
                SSHExecutor(inventory, known) as executor,
                HttpClusterProbe(inventory, secret) as recorder,
            ):
                return await deploy(
                    executor,
                    names,
                    secret=secret,
                    inventory_text=inventory_path.read_text(),
                    python=BASE_PYTHON,
                    offline=True,
                    dry_run=dry_run,
                    cache_dir=tmp_path / "cache",
                    recorder=recorder,
                )

        return run_in_namespace(operator.ns, go, STEP_TIMEOUT_S)

    dry = run_deploy(dry_run=True)
    for name in names:
        assert dry[name].status == INSTALLED, dry[name]
        assert dry[name].dry_run
        assert any("install shoal" in step for step in dry[name].steps)
        assert any("the cluster secret" in step for step in dry[name].steps)
        assert "deploy-test-secret" not in " ".join(dry[name].steps)
    for host in targets:  # checked on the host: nothing was written
        assert host.run(["test", "-e", str(roots[host.name])], check=False).returncode == 1

    first = run_deploy(dry_run=False)
    for name in names:
        assert first[name].status == INSTALLED, first[name]
        assert first[name].pid is not None
        assert first[name].audit_problem is None
        secret_file = roots[name] / "secret"
        assert secret_file.stat().st_mode & 0o777 == 0o600
        assert secret_file.read_bytes().strip() == secret

    def views() -> dict[str, set[str]]:
        async def go() -> dict[str, set[str]]:
            seen: dict[str, set[str]] = {}
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=5),
                middlewares=(signing_middleware(secret, "cli-deploy-test"),),
            ) as session:
                for host in targets:
                    url = f"http://{host.endpoint}/v1/peers"
                    async with session.get(url) as response:
                        document = await response.json()
                    seen[host.name] = {
                        m["node_id"] for m in document["members"] if m["state"] == "alive"
                    }
            return seen

        return run_in_namespace(operator.ns, go, 30.0)

    def see_each_other() -> bool:
        try:
            return all(set(names) <= seen for seen in views().values())
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    wait_until(
        see_each_other,
        timeout_s=60,
        interval_s=0.5,
        message="both deployed daemons see each other alive",
    )

    second = run_deploy(dry_run=False)
    for name in names:
        assert second[name].status == UNCHANGED, second[name]
        assert second[name].steps == ()
        assert second[name].pid == first[name].pid
        assert os.path.exists(f"/proc/{first[name].pid}")

    # A rolling upgrade: a changed inventory (a new label) changes every host's fingerprint.
    inventory_document["hosts"][names[0]]["labels"] = {"rack": "r1"}  # type: ignore[index]
    inventory_path.write_text(yaml.safe_dump(inventory_document))
    inventory = load_inventory(inventory_path)
    progress: list[str] = []

    async def roll() -> RollingReport:
        async with (
            SSHExecutor(inventory, known) as executor,
            HttpClusterProbe(inventory, secret) as probe,
        ):
            desired, early = await desired_for_hosts(
                executor,
                names,
                secret=secret,
                inventory_text=inventory_path.read_text(),
                python=BASE_PYTHON,
                offline=True,
                cache_dir=tmp_path / "cache",
                tls=False,
            )
            upgrader = SshUpgrader(executor, desired, early, recorder=probe)
            return await rolling_upgrade(
                names,
                members=names,
                voters=inventory.voters,
                upgrader=upgrader,
                probe=probe,
                settle_timeout_s=120.0,
                progress=progress.append,
            )

    rolled = run_in_namespace(operator.ns, roll, STEP_TIMEOUT_S * 2)
    assert rolled.ok, "\n".join(progress)
    assert sorted(rolled.order) == sorted(names)
    assert rolled.order[-1] == rolled.coordinator_before  # the coordinator went last
    for outcome in rolled.outcomes:
        assert outcome.state == UPGRADED_AND_SETTLED, outcome
        assert outcome.result is not None
        assert outcome.result.status == UPGRADED
        assert outcome.result.pid != first[outcome.host].pid
        assert outcome.audit is None
    assert any("waiting:" in line for line in progress)
    wait_until(see_each_other, timeout_s=60, interval_s=0.5, message="all three see each other")

    def deploys_recorded(host_index: int) -> list[dict[str, object]]:
        async def go() -> list[dict[str, object]]:
            path = "/v1/audit?kind=deploy"
            url = f"http://{targets[host_index].endpoint}{path}"
            signer = signing_middleware(secret, "cli-deploy-test")
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=5), middlewares=(signer,)
                ) as session,
                session.get(url) as response,
            ):
                entries: list[dict[str, object]] = (await response.json())["entries"]
                return entries

        return run_in_namespace(operator.ns, go, 30.0)

    for index, name in enumerate(names):
        entries = deploys_recorded(index)
        assert [(e["action"], e["subject"]) for e in entries] == [
            ("deploy", name),  # the first deploy
            ("deploy", name),  # the rolling upgrade
        ]
        details = [e["detail"] for e in entries]
        assert [d["rolling"] for d in details] == [False, True]  # type: ignore[index]

    # A roll whose first host does not come back (its new config has a key the daemon
    # refuses) stops there with that host's log lines; the others keep running, untouched.
    inventory_document["hosts"][names[0]]["labels"] = {"rack": "r2"}  # type: ignore[index]
    inventory_path.write_text(yaml.safe_dump(inventory_document))
    inventory = load_inventory(inventory_path)
    pids_before = {o.host: o.result.pid for o in rolled.outcomes if o.result is not None}

    async def broken_roll() -> tuple[str, RollingReport]:
        async with (
            SSHExecutor(inventory, known) as executor,
            HttpClusterProbe(inventory, secret) as probe,
        ):
            desired, early = await desired_for_hosts(
                executor,
                names,
                secret=secret,
                inventory_text=inventory_path.read_text(),
                python=BASE_PYTHON,
                offline=True,
                cache_dir=tmp_path / "cache",
                tls=False,
            )
            coordinator, _ = agreed_coordinator(names, await probe_all(probe, names))
            broken = rolling_order(names, inventory.voters, coordinator)[0]
            bad_config = desired[broken].node_config + "no_such_setting: 1\n"
            desired[broken] = dataclasses.replace(desired[broken], node_config=bad_config)
            upgrader = SshUpgrader(executor, desired, early, health_timeout_s=20.0, recorder=probe)
            report = await rolling_upgrade(
                names,
                members=names,
                voters=inventory.voters,
                upgrader=upgrader,
                probe=probe,
                settle_timeout_s=60.0,
            )
            return broken, report

    broken, stopped = run_in_namespace(operator.ns, broken_roll, STEP_TIMEOUT_S * 2)
    assert not stopped.ok
    assert stopped.stopped_at == broken
    assert stopped.order[0] == broken
    first_outcome, *rest = stopped.outcomes
    assert first_outcome.state == STOPPED
    assert first_outcome.reason is not None
    assert "not healthy" in first_outcome.reason
    assert first_outcome.log_tail is not None
    assert "no_such_setting" in first_outcome.log_tail
    assert [o.state for o in rest] == [UNTOUCHED, UNTOUCHED]
    for outcome in rest:
        pid = pids_before[outcome.host]
        assert pid is not None
        assert os.path.exists(f"/proc/{pid}")
        assert not _zombie(pid)

    healed = run_deploy(dry_run=False)  # the right config everywhere again
    assert healed[broken].status == UPGRADED, healed[broken]
    wait_until(see_each_other, timeout_s=60, interval_s=0.5, message="healed: all see each other")

    async def ready() -> ReadyNode:
        return await ready_node(
            ssh=names[1],
            inventory=inventory,
            secret=secret,
            known_hosts=known,
            python=BASE_PYTHON,
            offline=True,
            cache_dir=tmp_path / "cache",
        )

    # The jobs API's `ssh` mode: acquire + deploy (unchanged here) + the node's URL.
    node = run_in_namespace(operator.ns, ready, STEP_TIMEOUT_S)
    assert node.url == f"http://{targets[1].endpoint}"
    assert node.deployed is not None
    assert node.deployed.status == UNCHANGED
    assert node.handle is None

    async def take_off() -> DeployResult:
        async with SSHExecutor(inventory, known) as executor:
            return await undeploy_host(executor, names[0])

    removed = run_in_namespace(operator.ns, take_off, STEP_TIMEOUT_S)
    assert removed.status == REMOVED, removed
    pid = first[names[0]].pid
    wait_until(
        lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid),
        timeout_s=30,
        message="the undeployed daemon stopped",
    )
    assert (roots[names[0]] / "data").is_dir()
    assert not (roots[names[0]] / "venv").exists()
    assert not (roots[names[0]] / "secret").exists()


def _zombie(pid: int | None) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True
