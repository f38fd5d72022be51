"""`shoal deploy --rolling --dry-run --ca` against real sshds on loopback (no daemon runs
there): the order, the checks and the certificate to issue are printed, nothing is written on
the hosts or in the CA. And the TLS files pushed over real SFTP carry their modes (key 600),
and the next probe finds the certificate and keeps it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from config import load_inventory
from config.tls import init_ca, read_index
from node.cli.app import app
from node.ssh import SSHExecutor
from node.ssh.certs import node_tls, tls_paths
from node.ssh.deploy import _execute, host_facts
from node.ssh.plan import tls_steps
from tests.cluster.cluster import free_port
from tests.cluster.sshd import ClientKey, SshServer, make_client_key, requires_sshd, start_sshd

pytestmark = [requires_sshd(), pytest.mark.timeout(180)]
SECRET = "cli-deploy-secret-0123456789abcdef"


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


def write_setup(tmp_path: Path, servers: list[SshServer], key: ClientKey) -> dict[str, Path]:
    hosts = {
        f"h{i}": {
            "ssh_host": s.address,
            "ssh_port": s.port,
            "ssh_user": "root",
            "ssh_key": str(key.path),
            "path": str(tmp_path / "targets" / f"h{i}"),
            "p2p_port": free_port(),
        }
        for i, s in enumerate(servers)
    }
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump({"cluster": {"name": "clitest", "voters": ["h0"]}, "hosts": hosts})
    )
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(s.known_hosts_line() for s in servers) + "\n")
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    ca = tmp_path / "ca"
    init_ca(ca)
    return {"inventory": inventory, "known": known, "secret": secret, "ca": ca}


def test_rolling_dry_run_prints_the_order_checks_and_certificates(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    files = write_setup(tmp_path, servers, client_key)
    argv = [
        "deploy",
        "--all",
        "--rolling",
        "--dry-run",
        "--inventory",
        str(files["inventory"]),
        "--known-hosts",
        str(files["known"]),
        "--secret-file",
        str(files["secret"]),
        "--ca",
        str(files["ca"]),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--settle-timeout",
        "45",
    ]
    result = CliRunner().invoke(app, argv)
    out = result.output
    assert result.exit_code == 0, out
    assert "rolling upgrade (dry run: nothing changed): order h1 -> h0" in out
    assert "1. h1 (non-voter): installed" in out
    assert "2. h0 (voter): installed" in out
    assert "before: at least 1 of the 1 voters answer besides h0" in out
    assert "now: stopping voter h0 would leave 0 of 1 voters alive" in out
    assert "after: h0 alive at 2 of 2 members and a coordinator named by 2 (within 45s)" in out
    assert "1. h1 (non-voter): installed" in out
    assert not (tmp_path / "targets").exists()
    assert read_index(files["ca"]).issued == ()

    document = json.loads(CliRunner().invoke(app, [*argv, "--json"]).output)
    assert document["order"] == ["h1", "h0"]
    assert document["dry_run"] is True
    h1 = document["hosts"][0]
    assert h1["state"] == "planned"
    assert h1["result"]["certificate"]["pending"] is True
    assert h1["result"]["steps"][0].startswith("issue a node certificate for h1")
    assert any("tls/node.key (mode 600, the node key)" in s for s in h1["result"]["steps"])


def test_tls_files_pushed_over_sftp_keep_their_modes_and_are_kept_next_time(
    servers: list[SshServer], client_key: ClientKey, tmp_path: Path
) -> None:
    files = write_setup(tmp_path, servers, client_key)
    inventory = load_inventory(files["inventory"])
    root = tmp_path / "targets" / "h0"
    root.mkdir(parents=True)

    async def go() -> tuple[str, str]:
        async with SSHExecutor(inventory, files["known"]) as executor:
            entry = inventory.hosts["h0"]
            facts = await host_facts(executor, "h0", entry)
            first = node_tls(files["ca"], "h0", entry, facts.tls_cert, facts.tls_key)
            await executor.run("h0", ["mkdir", "-p", f"{root}/tls"], 30.0)
            await _execute(executor, "h0", tls_steps(str(root), first), 60.0)
            again = await host_facts(executor, "h0", entry)
            kept = node_tls(files["ca"], "h0", entry, again.tls_cert, again.tls_key)
            assert again.tls_cert == first.cert_pem
            assert kept.key_pem is None
            return first.serial, kept.serial

    issued, kept = asyncio.run(go())
    assert issued == kept
    paths = tls_paths(str(root))
    assert Path(paths.key).stat().st_mode & 0o777 == 0o600
    for path in (paths.ca, paths.cert, paths.crl):
        assert Path(path).stat().st_mode & 0o777 == 0o644
    assert Path(paths.ca).read_bytes() == (files["ca"] / "ca.crt").read_bytes()
    assert Path(paths.crl).read_bytes() == (files["ca"] / "crl.pem").read_bytes()
    assert [row.name for row in read_index(files["ca"]).issued] == ["h0"]
