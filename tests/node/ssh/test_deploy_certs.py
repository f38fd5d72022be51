"""`shoal deploy --ca DIR`: each host's node certificate issued from the operator's CA (identity
the host name, role node, its addresses as SANs), kept while still good, replaced when revoked,
expiring, keyless or of another CA; the files pushed with their modes (key 600) and the node
config's `tls:` block."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from config import parse_inventory
from config.tls import CertRole, init_ca, read_index, revoke, verify_peer_certificate
from node.ssh.certs import RENEW_BEFORE, NodeTls, node_tls, tls_paths
from node.ssh.plan import (
    UNCHANGED,
    UPGRADED,
    Desired,
    HostFacts,
    WriteFile,
    node_config_text,
    parse_facts,
    plan_deploy,
    probe_script,
)
from node.ssh.wheels import Wheel

INVENTORY = parse_inventory(
    {
        "cluster": {"name": "certs"},
        "hosts": {
            "gpu-a": {"ssh_host": "203.0.113.5", "internal_ip": "10.1.0.5", "path": "/srv/shoal"},
            "gpu-b": {"ssh_host": "gpu-b.example.net", "path": "/srv/shoal"},
        },
    }
)
NOW = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    init_ca(directory, now=NOW - timedelta(days=1))
    return directory


def issue(ca_dir: Path, host: str = "gpu-a", **kwargs: object) -> NodeTls:
    entry = INVENTORY.hosts[host]
    existing = kwargs.pop("existing", None)
    has_key = bool(kwargs.pop("has_key", existing is not None))
    return node_tls(ca_dir, host, entry, existing, has_key, now=NOW, **kwargs)  # type: ignore[arg-type]


def test_a_host_without_a_certificate_gets_one_naming_it_as_a_node(ca_dir: Path) -> None:
    tls = issue(ca_dir)
    assert tls.issued
    assert not tls.pending
    assert tls.key_pem is not None
    assert b"PRIVATE KEY" in tls.key_pem
    assert tls.reason == "the host has no certificate"
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    identity = verify_peer_certificate(tls.cert_pem, ca_cert, now=NOW)
    assert (identity.name, identity.role) == ("gpu-a", CertRole.NODE)
    cert = x509.load_pem_x509_certificate(tls.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {
        "10.1.0.5",
        "203.0.113.5",
    }
    assert tls.ca_pem == (ca_dir / "ca.crt").read_bytes()
    assert tls.crl_pem == (ca_dir / "crl.pem").read_bytes()
    assert [row.name for row in read_index(ca_dir).issued] == ["gpu-a"]
    assert "PRIVATE" not in repr(tls)
    dns = issue(ca_dir, "gpu-b")
    names = x509.load_pem_x509_certificate(dns.cert_pem).extensions
    alt = names.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(alt.get_values_for_type(x509.DNSName)) == {"gpu-b", "gpu-b.example.net"}


def test_a_good_certificate_is_kept_and_a_bad_one_replaced(ca_dir: Path) -> None:
    first = issue(ca_dir)
    kept = issue(ca_dir, existing=first.cert_pem)
    assert not kept.issued
    assert kept.key_pem is None
    assert kept.serial == first.serial
    assert len(read_index(ca_dir).issued) == 1
    keyless = issue(ca_dir, existing=first.cert_pem, has_key=False)
    assert keyless.issued
    assert "no key" in keyless.reason
    other = issue(ca_dir, "gpu-b")
    wrong = issue(ca_dir, existing=other.cert_pem)
    assert wrong.issued
    assert "names gpu-b" in wrong.reason
    revoke(ca_dir, keyless.serial, now=NOW)
    revoked = issue(ca_dir, existing=keyless.cert_pem)
    assert revoked.issued
    assert "revoked" in revoked.reason
    late = node_tls(
        ca_dir,
        "gpu-a",
        INVENTORY.hosts["gpu-a"],
        revoked.cert_pem,
        True,
        now=NOW + timedelta(days=365) - RENEW_BEFORE + timedelta(days=1),
    )
    assert late.issued
    assert "expires" in late.reason


def test_a_certificate_of_another_ca_is_replaced(ca_dir: Path, tmp_path: Path) -> None:
    other_ca = tmp_path / "other"
    init_ca(other_ca, now=NOW - timedelta(days=1))
    foreign = issue(other_ca)
    replaced = issue(ca_dir, existing=foreign.cert_pem)
    assert replaced.issued
    assert "not issued by the cluster CA" in replaced.reason


def test_a_dry_run_issues_nothing(ca_dir: Path) -> None:
    tls = issue(ca_dir, issue=False)
    assert tls.pending
    assert tls.issued
    assert tls.cert_pem == b""
    assert read_index(ca_dir).issued == ()


def desired(tls: NodeTls | None) -> Desired:
    shoal = Wheel(Path("/cache/shoal-0.1.0+gabc-py3-none-any.whl"), "aa")
    config = node_config_text("gpu-a", INVENTORY.hosts["gpu-a"], INVENTORY, "/srv/shoal", tls=True)
    return Desired(shoal, (), config, "hosts: {}\n", b"secret-xyz", "python3", False, tls)


def test_the_plan_pushes_the_files_with_their_modes_and_the_config_names_them(
    ca_dir: Path,
) -> None:
    tls = issue(ca_dir)
    want = desired(tls)
    facts = HostFacts("/root", False, None, None, False, frozenset())
    status, steps = plan_deploy("gpu-a", INVENTORY.hosts["gpu-a"], facts, want)
    writes = {s.remote: s for s in steps if isinstance(s, WriteFile)}
    paths = tls_paths("/srv/shoal")
    assert writes[paths.key].mode == 0o600
    assert writes[paths.key].secret
    assert writes[paths.key].text.encode() == tls.key_pem
    assert "the node key" in writes[paths.key].describe()
    assert "PRIVATE" not in writes[paths.key].describe() + repr(writes[paths.key])
    for path in (paths.ca, paths.cert, paths.crl):
        assert writes[path].mode == 0o644
    assert writes[paths.cert].text.encode() == tls.cert_pem
    config = yaml.safe_load(want.node_config)
    assert config["tls"] == {
        "ca": "/srv/shoal/tls/ca.crt",
        "cert": "/srv/shoal/tls/node.crt",
        "key": "/srv/shoal/tls/node.key",
        "crl": "/srv/shoal/tls/crl.pem",
    }
    assert "tls:" not in node_config_text(
        "gpu-a", INVENTORY.hosts["gpu-a"], INVENTORY, "/srv/shoal"
    )
    # Deployed, then the same certificate kept: unchanged; a new certificate: an upgrade
    # that writes no key unless one was issued.
    deployed: dict[str, object] = {"fingerprint": want.fingerprint, "service": "detached"}
    again = HostFacts("/root", False, deployed, 7, True, frozenset(), tls.cert_pem, True)
    kept = issue(ca_dir, existing=tls.cert_pem)
    assert plan_deploy("gpu-a", INVENTORY.hosts["gpu-a"], again, desired(kept)) == (
        UNCHANGED,
        [],
    )
    renewed = issue(ca_dir, existing=tls.cert_pem, has_key=False)
    status, steps = plan_deploy("gpu-a", INVENTORY.hosts["gpu-a"], again, desired(renewed))
    assert status == UPGRADED
    assert paths.key in {s.remote for s in steps if isinstance(s, WriteFile)}


def test_the_probe_reads_the_hosts_certificate_and_key(ca_dir: Path, tmp_path: Path) -> None:
    tls = issue(ca_dir)
    root = tmp_path / "host"
    (root / "tls").mkdir(parents=True)
    (root / "tls" / "node.crt").write_bytes(tls.cert_pem)

    async def probe() -> str:
        process = await asyncio.create_subprocess_exec(
            "sh", "-c", probe_script(str(root)), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await process.communicate()
        return out.decode()

    facts = parse_facts(asyncio.run(probe()))
    assert facts.tls_cert == tls.cert_pem
    assert not facts.tls_key
    (root / "tls" / "node.key").write_bytes(b"k")
    assert parse_facts(asyncio.run(probe())).tls_key
    assert parse_facts("tlscert=!!notbase64\n").tls_cert is None
