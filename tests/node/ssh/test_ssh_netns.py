"""The executor against real sshds in three netns hosts: a changed key fails one host only, and
a proxy_jump reaches a host that only its jump host can reach."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncssh
import pytest

from config import Timeouts, parse_inventory
from node.ssh import SSHExecutor, SSHResult
from tests.cluster.fixtures import NetnsClusterFactory
from tests.cluster.netns import NetnsCluster
from tests.cluster.sshd import (
    ClientKey,
    SshServer,
    make_client_key,
    requires_sshd,
    run_in_namespace,
    start_sshd,
)

pytestmark = [
    pytest.mark.netns,
    requires_sshd(),
]
TEST_TIMEOUT_S = 60.0


def sshd_hosts(cluster: NetnsCluster, tmp_path: Path, key: ClientKey) -> list[SshServer]:
    return [
        start_sshd(tmp_path / f"sshd-{h.name}", [key.public_line], host=h, name="sshd")
        for h in cluster.hosts
    ]


def test_changed_key_fails_one_host_and_proxy_jump_reaches_a_hidden_host(
    netns_cluster: NetnsClusterFactory, tmp_path: Path
) -> None:
    cluster = netns_cluster(3)
    key = make_client_key(tmp_path / "client")
    servers = sshd_hosts(cluster, tmp_path, key)
    client, jump, hidden = cluster.hosts
    base = {"ssh_user": "root", "ssh_key": str(key.path)}
    inventory = parse_inventory(
        {
            "hosts": {
                "a": {**base, "ssh_host": client.address},
                "b": {**base, "ssh_host": jump.address},
                "c": {**base, "ssh_host": hidden.address},
                "c-via-b": {
                    **base,
                    "ssh_host": hidden.address,
                    "proxy_jump": "b",
                    "p2p_port": 8771,
                },
            }
        }
    )
    other = asyncssh.generate_private_key("ssh-ed25519")
    known = tmp_path / "known_hosts"
    known.write_text(
        "\n".join([servers[0].known_hosts_line(), servers[1].known_hosts_line(other)]) + "\n"
    )

    async def changed_key() -> dict[str, SSHResult]:
        async with SSHExecutor(inventory, known) as executor:
            return await executor.run_parallel(["a", "b", "c"], ["hostname", "-I"])

    # c's key is unknown, b's changed: both fail with a host-key error, a answers.
    results = run_in_namespace(client.ns, changed_key, TEST_TIMEOUT_S)
    assert results["a"].ok
    assert client.address in results["a"].stdout
    for name in ("b", "c"):
        error = results[name].error
        assert error is not None
        assert "host key" in error
        assert f"shoal ssh trust {name} --yes" in error

    known.write_text("\n".join(s.known_hosts_line() for s in servers) + "\n")
    results = run_in_namespace(client.ns, changed_key, TEST_TIMEOUT_S)
    assert all(r.ok for r in results.values()), results

    cluster.partition_one_way([client], [hidden])  # c now drops what a sends it

    async def through_jump() -> dict[str, SSHResult]:
        timeouts = Timeouts(ssh_connect_s=2.0)
        async with SSHExecutor(inventory, known, timeouts=timeouts) as executor:
            return await executor.run_parallel(["c", "c-via-b"], ["hostname", "-I"])

    results = run_in_namespace(client.ns, through_jump, TEST_TIMEOUT_S)
    assert "no SSH connection in time" in (results["c"].error or "")
    assert results["c-via-b"].ok, results["c-via-b"]
    assert hidden.address in results["c-via-b"].stdout

    async def jump_kept_while_tunnelling() -> SSHResult:
        # idle_s=0: every run expires idle connections, but never b while c-via-b runs
        # through it.
        async with SSHExecutor(inventory, known, idle_s=0.0) as executor:
            slow = asyncio.create_task(executor.run("c-via-b", "sleep 1; echo done"))
            while executor.pool.connects < 2:
                await asyncio.sleep(0.01)
            for _ in range(5):
                assert (await executor.run("a", "true")).ok
                await asyncio.sleep(0.1)
            return await slow

    slow = run_in_namespace(client.ns, jump_kept_while_tunnelling, TEST_TIMEOUT_S)
    assert slow.ok, slow
    assert slow.stdout == "done\n"
