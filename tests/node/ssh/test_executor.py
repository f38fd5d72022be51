"""SSHExecutor against real sshds on loopback: results, errors per host, pooling, trust, check."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
import yaml
from typer.testing import CliRunner

from config import Inventory, Timeouts, parse_inventory
from node.cli.app import app
from node.ssh import (
    SSHExecutor,
    add_host_key,
    check_hosts,
    detect_host_memory,
    fetch_host_key,
    parse_probe,
)
from node.ssh.trust import CHANGED, TRUSTED, UNKNOWN
from tests.cluster.cluster import free_port
from tests.cluster.sshd import (
    ClientKey,
    SshServer,
    make_client_key,
    requires_sshd,
    start_sshd,
)

pytestmark = requires_sshd()


@pytest.fixture
def client_key(tmp_path: Path) -> ClientKey:
    return make_client_key(tmp_path / "client")


@pytest.fixture
def servers(tmp_path: Path, client_key: ClientKey) -> Iterator[list[SshServer]]:
    started: list[SshServer] = []
    try:
        for i in range(2):
            started.append(
                start_sshd(
                    tmp_path / f"sshd{i}",
                    [client_key.public_line],
                    port=free_port(),
                    name=f"sshd{i}",
                )
            )
        yield started
    finally:
        for server in started:
            server.stop()


def inventory_of(servers: list[SshServer], key: ClientKey, **extra: dict[str, object]) -> Inventory:
    hosts: dict[str, dict[str, object]] = {
        f"h{i}": {
            "ssh_host": s.address,
            "ssh_port": s.port,
            "ssh_user": "root",
            "ssh_key": str(key.path),
            "p2p_port": 9000 + i,
        }
        for i, s in enumerate(servers)
    }
    for name, fields in extra.items():
        hosts[name] = {"ssh_user": "root", "ssh_key": str(key.path), **fields}
    return parse_inventory({"hosts": hosts})


def write_known_hosts(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


async def test_run_returns_exit_code_and_output(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    known = write_known_hosts(tmp_path / "kh", [s.known_hosts_line() for s in servers])
    async with SSHExecutor(inventory_of(servers, client_key), known) as executor:
        done = await executor.run("h0", ["sh", "-c", "echo out $0; echo err >&2; exit 3", "a b"])
        assert (done.exit_code, done.stdout, done.stderr, done.error) == (
            3,
            "out a b\n",
            "err\n",
            None,
        )
        assert not done.ok
        assert (await executor.run("h1", "true")).ok


async def test_one_host_key_changed_fails_only_that_host(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    known = write_known_hosts(
        tmp_path / "kh", [servers[0].known_hosts_line(), servers[1].known_hosts_line(other)]
    )
    async with SSHExecutor(inventory_of(servers, client_key), known) as executor:
        results = await executor.run_parallel(["h0", "h1"], ["echo", "hi"])
    assert results["h0"].ok
    assert results["h0"].stdout == "hi\n"
    error = results["h1"].error
    assert error is not None
    assert "host key" in error
    assert "h1" in error
    assert "shoal ssh trust h1 --yes" in error
    assert results["h1"].exit_code is None


async def test_refused_key_unreachable_and_timeout_are_results(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    stranger = make_client_key(tmp_path / "stranger")
    closed_port = free_port()
    inventory = inventory_of(
        servers,
        client_key,
        bad={
            "ssh_host": "127.0.0.1",
            "ssh_port": servers[0].port,
            "ssh_key": str(stranger.path),
            "p2p_port": 9100,
        },
        gone={"ssh_host": "127.0.0.1", "ssh_port": closed_port, "p2p_port": 9101},
    )
    known = write_known_hosts(
        tmp_path / "kh",
        [s.known_hosts_line() for s in servers]
        + [f"[127.0.0.1]:{closed_port} {servers[0].known_hosts_line().split(' ', 1)[1]}"],
    )
    async with SSHExecutor(inventory, known, timeouts=Timeouts(ssh_connect_s=5.0)) as executor:
        results = await executor.run_parallel(["bad", "gone", "h1"], "sleep 30", timeout_s=0.5)
    assert "refused" in (results["bad"].error or "")
    assert "unreachable" in (results["gone"].error or "")
    assert "did not finish in 0.5s" in (results["h1"].error or "")


async def test_connections_are_reused_until_idle(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    known = write_known_hosts(tmp_path / "kh", [s.known_hosts_line() for s in servers])
    inventory = inventory_of(servers, client_key)
    async with SSHExecutor(inventory, known) as executor:
        for _ in range(3):
            assert (await executor.run("h0", "true")).ok
        assert executor.pool.connects == 1
    async with SSHExecutor(inventory, known, idle_s=0.0) as executor:
        for _ in range(3):
            assert (await executor.run("h0", "true")).ok
        assert executor.pool.connects == 3
    async with SSHExecutor(inventory, known, reuse=False) as executor:
        for _ in range(2):
            assert (await executor.run("h0", "true")).ok
        assert executor.pool.connects == 2


async def test_a_connection_in_use_is_never_expired(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    known = write_known_hosts(tmp_path / "kh", [s.known_hosts_line() for s in servers])
    async with SSHExecutor(inventory_of(servers, client_key), known, idle_s=0.0) as executor:
        slow = asyncio.create_task(executor.run("h0", "sleep 1; echo done"))
        while executor.pool.connects == 0:
            await asyncio.sleep(0.01)
        for _ in range(5):  # each opens (and expires idle) connections while h0's command runs
            assert (await executor.run("h1", "true")).ok
            await asyncio.sleep(0.1)
        result = await slow
    assert result.ok, result
    assert result.stdout == "done\n"


async def test_trust_fetches_adds_and_detects_a_changed_key(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    known = tmp_path / "kh"
    async with SSHExecutor(inventory_of(servers, client_key), known) as executor:
        assert "host key" in ((await executor.run("h0", "true")).error or "")
        info = await fetch_host_key(executor.pool, executor.endpoint("h0"))
        assert info.status == UNKNOWN
        assert info.fingerprint == servers[0].host_key.get_fingerprint("sha256")
        add_host_key(known, info)
        assert (await executor.run("h0", "true")).ok
        assert (await fetch_host_key(executor.pool, executor.endpoint("h0"))).status == TRUSTED
    assert known.stat().st_mode & 0o777 == 0o600
    other = asyncssh.generate_private_key("ssh-ed25519")
    write_known_hosts(known, [servers[0].known_hosts_line(other)])
    async with SSHExecutor(inventory_of(servers, client_key), known) as executor:
        changed = await fetch_host_key(executor.pool, executor.endpoint("h0"))
        assert changed.status == CHANGED
        add_host_key(known, changed)
        assert (await executor.run("h0", "true")).ok
    assert len(known.read_text().splitlines()) == 1


async def test_check_and_memory_read_the_host(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    known = write_known_hosts(tmp_path / "kh", [s.known_hosts_line() for s in servers])
    async with SSHExecutor(inventory_of(servers, client_key), known) as executor:
        rows = await check_hosts(executor, ["h0"], {"h0": str(tmp_path / "not" / "yet")})
        memory = await detect_host_memory("h1", executor)
    row = rows["h0"]
    assert row.error is None
    assert row.host_key == "ok"
    assert row.python is not None
    assert row.python.count(".") == 2
    assert row.disk_free_gb is not None
    assert row.disk_free_gb > 0
    assert memory.cpu_memory_gb > 0


def test_parse_probe_reads_gpus() -> None:
    python, disk, memory = parse_probe(
        "python=3.11.2\nmem_kb=2097152\ndisk_free_kb=1048576\ngpu_mib=81920\ngpu_mib=40960\n"
    )
    assert (python, disk) == ("3.11.2", 1.0)
    assert (memory.cpu_memory_gb, memory.gpu_memory_gb, memory.gpu_count) == (2.0, 40.0, 2)
    assert parse_probe("python=none\n")[0] is None


def test_cli_run_json_and_exit_code(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    inventory = inventory_of(servers, client_key)
    inv_file = tmp_path / "inventory.yaml"
    inv_file.write_text(yaml.safe_dump(inventory.model_dump(mode="json", exclude_none=True)))
    known = write_known_hosts(tmp_path / "kh", [servers[0].known_hosts_line()])
    base = ["ssh", "run", "--inventory", str(inv_file), "--known-hosts", str(known), "--json"]
    runner = CliRunner()
    done = runner.invoke(app, [*base, "h0", "--", "echo", "a b"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["results"]["h0"]["stdout"] == "a b\n"
    both = runner.invoke(app, [*base, "--all", "--", "true"])
    assert both.exit_code == 1
    results = json.loads(both.stdout)["results"]
    assert results["h0"]["exit_code"] == 0
    assert "host key" in results["h1"]["error"]


def write_inventory(path: Path, inventory: Inventory) -> Path:
    path.write_text(yaml.safe_dump(inventory.model_dump(mode="json", exclude_none=True)))
    return path


def test_cli_trust_asks_before_adding(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    inv_file = write_inventory(tmp_path / "inventory.yaml", inventory_of(servers, client_key))
    known = tmp_path / "kh"
    base = ["ssh", "trust", "h1", "--inventory", str(inv_file), "--known-hosts", str(known)]
    runner = CliRunner()
    asked = runner.invoke(app, base)
    assert asked.exit_code == 1
    assert servers[1].host_key.get_fingerprint("sha256") in asked.stdout
    assert "--yes" in asked.stdout
    assert not known.exists()
    added = runner.invoke(app, [*base, "--yes"])
    assert added.exit_code == 0, added.output
    assert known.read_text().strip() == servers[1].known_hosts_line()
    assert "already in" in runner.invoke(app, base).stdout


def test_cli_check_and_deploy_dry_run_write_nothing(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    inventory = inventory_of(servers, client_key)
    target = tmp_path / "target"
    hosts = {
        name: entry.model_dump(mode="json", exclude_none=True)
        for name, entry in inventory.hosts.items()
    }
    hosts["h0"]["path"] = str(target)
    inv_file = tmp_path / "inventory.yaml"
    inv_file.write_text(yaml.safe_dump({"hosts": hosts}))
    known = write_known_hosts(tmp_path / "kh", [s.known_hosts_line() for s in servers])
    secret = tmp_path / "secret"
    secret.write_text("s3cret-value-never-printed\n")
    secret.chmod(0o600)
    common = ["--inventory", str(inv_file), "--known-hosts", str(known)]
    runner = CliRunner()
    check = runner.invoke(app, ["ssh", "check", "h0", *common, "--json"])
    assert check.exit_code == 0, check.output
    row = json.loads(check.stdout)["hosts"]["h0"]
    assert row["host_key"] == "ok"
    assert row["error"] is None
    dry = runner.invoke(
        app,
        [
            "deploy",
            "h0",
            *common,
            "--dry-run",
            "--secret-file",
            str(secret),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
    )
    assert dry.exit_code == 0, dry.output
    assert "h0: installed" in dry.stdout
    assert "dry run" in dry.stdout
    assert "start the daemon detached" in dry.stdout  # no systemd on this host
    assert "s3cret" not in dry.stdout
    assert not target.exists()
    no_secret = runner.invoke(app, ["deploy", "h0", *common, "--dry-run"])
    assert no_secret.exit_code == 2
    assert "--secret-file" in no_secret.output
