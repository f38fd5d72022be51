"""The cluster CA in a directory: init, issue, the index, revoke and the CRL."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID

from config import CaError
from config.tls import (
    CA_CERT,
    CA_KEY,
    CRL_FILE,
    CertRole,
    identity_of,
    init_ca,
    issue_certificate,
    load_ca,
    load_certificate,
    load_crl,
    parse_san,
    read_index,
    revoke,
    role_of,
    serial_text,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _crl_number(directory: Path) -> int:
    crl = load_crl(directory / CRL_FILE)
    return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number


def test_init_makes_a_p256_key_of_mode_600_a_self_signed_ca_and_an_empty_crl(
    tmp_path: Path,
) -> None:
    ca = init_ca(tmp_path / "ca")
    assert _mode(tmp_path / "ca" / CA_KEY) == 0o600
    assert _mode(tmp_path / "ca") == 0o700
    assert isinstance(ca.key, ec.EllipticCurvePrivateKey)
    assert ca.key.curve.name == "secp256r1"
    cert = load_certificate(tmp_path / "ca" / CA_CERT)
    assert cert.subject == cert.issuer
    cert.verify_directly_issued_by(cert)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    crl = load_crl(tmp_path / "ca" / CRL_FILE)
    assert crl.is_signature_valid(ca.key.public_key())
    assert len(crl) == 0
    assert read_index(tmp_path / "ca").issued == ()
    assert load_ca(tmp_path / "ca").cert == cert


def test_init_refuses_an_existing_ca_unless_forced(tmp_path: Path) -> None:
    first = init_ca(tmp_path)
    with pytest.raises(CaError, match=r"already holds a CA.*--force"):
        init_ca(tmp_path)
    assert load_ca(tmp_path).cert == first.cert
    second = init_ca(tmp_path, force=True)
    assert second.cert != first.cert
    assert load_ca(tmp_path).cert == second.cert


def test_init_refuses_a_file_as_dir_and_bad_days(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(CaError, match="not a directory"):
        init_ca(tmp_path / "file")
    with pytest.raises(CaError, match="1 to 3650 days"):
        init_ca(tmp_path / "ca", days=0)


def test_a_missing_ca_says_to_run_init(tmp_path: Path) -> None:
    with pytest.raises(CaError, match=r"no cluster CA.*shoal ca init"):
        load_ca(tmp_path)
    with pytest.raises(CaError, match="no cluster CA"):
        issue_certificate(tmp_path, "gpu-1", CertRole.NODE, out=tmp_path / "out")


def test_a_node_certificate_names_identity_role_sans_and_both_usages(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "ca")
    files = issue_certificate(
        tmp_path / "ca",
        "gpu-1",
        CertRole.NODE,
        out=tmp_path / "out",
        days=30,
        sans=["10.0.0.7", "Gpu-1.Example.org", "::1"],
    )
    assert files.key_path == tmp_path / "out" / "gpu-1.key"
    assert _mode(files.key_path) == 0o600
    assert load_certificate(files.ca_path) == ca.cert
    cert = load_certificate(files.cert_path)
    cert.verify_directly_issued_by(ca.cert)
    assert identity_of(cert) == "gpu-1"
    assert role_of(cert) is CertRole.NODE
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["gpu-1", "gpu-1.example.org"]
    assert sans.get_values_for_type(x509.IPAddress) == [ip_address("10.0.0.7"), ip_address("::1")]
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc > timedelta(days=30)
    assert cert.not_valid_after_utc - datetime.now(UTC) <= timedelta(days=30)
    assert serial_text(cert.serial_number) == serial_text(files.issued.serial)
    key = load_pem_private_key(files.key_path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key() == cert.public_key()


@pytest.mark.parametrize("role", [CertRole.OPERATOR, CertRole.READER])
def test_operator_and_reader_certificates_only_call(tmp_path: Path, role: CertRole) -> None:
    init_ca(tmp_path / "ca")
    files = issue_certificate(tmp_path / "ca", "alice", role, out=tmp_path / "out")
    cert = load_certificate(files.cert_path)
    assert role_of(cert) is role
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(CaError, match="--san is for node certificates"):
        issue_certificate(tmp_path / "ca", "bob", role, out=tmp_path / "out", sans=["10.0.0.1"])


def test_issue_records_every_certificate_in_the_index(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca")
    first = issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=tmp_path / "a")
    second = issue_certificate(tmp_path / "ca", "alice", CertRole.READER, out=tmp_path / "b")
    index = read_index(tmp_path / "ca")
    assert index.issued == (first.issued, second.issued)
    document = json.loads((tmp_path / "ca" / "index.json").read_text())
    assert [row["name"] for row in document["issued"]] == ["gpu-1", "alice"]
    assert document["issued"][0]["serial"] == serial_text(first.issued.serial)
    assert document["issued"][0]["role"] == "node"
    assert document["issued"][1]["not_after"] == second.issued.not_after.isoformat()


def test_issue_refuses_bad_names_days_sans_and_an_existing_key(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca", days=10)
    out = tmp_path / "out"
    with pytest.raises(CaError, match="not a valid identity name"):
        issue_certificate(tmp_path / "ca", "../etc", CertRole.NODE, out=out)
    with pytest.raises(CaError, match="'ca' is reserved"):
        issue_certificate(tmp_path / "ca", "CA", CertRole.NODE, out=tmp_path / "ca", force=True)
    assert load_ca(tmp_path / "ca").cert.subject.rfc4514_string().startswith("CN=shoal cluster")
    with pytest.raises(CaError, match="1 to 3650 days"):
        issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=out, days=0)
    with pytest.raises(CaError, match=r"the CA expires.*--days 9 or less"):
        issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=out, days=11)
    with pytest.raises(CaError, match="neither an IP address nor a DNS name"):
        issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=out, sans=["a b"])
    assert read_index(tmp_path / "ca").issued == ()
    issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=out, days=5)
    with pytest.raises(CaError, match=r"gpu-1\.key exists.*--force"):
        issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=out, days=5)
    issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=out, days=5, force=True)
    assert len(read_index(tmp_path / "ca").issued) == 2


def test_parse_san_tells_addresses_from_names() -> None:
    assert parse_san("198.18.0.4") == x509.IPAddress(ip_address("198.18.0.4"))
    assert parse_san("*.nodes.example") == x509.DNSName("*.nodes.example")
    with pytest.raises(CaError):
        parse_san("-bad")


def test_revoke_by_name_revokes_every_unrevoked_certificate_and_bumps_the_crl(
    tmp_path: Path,
) -> None:
    ca = init_ca(tmp_path / "ca")
    old = issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=tmp_path / "a").issued
    new = issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=tmp_path / "b").issued
    other = issue_certificate(tmp_path / "ca", "gpu-2", CertRole.NODE, out=tmp_path / "c").issued
    assert _crl_number(tmp_path / "ca") == 0
    revoked, number = revoke(tmp_path / "ca", "gpu-1")
    assert {row.serial for row in revoked} == {old.serial, new.serial}
    assert number == 1
    assert _crl_number(tmp_path / "ca") == 1
    crl = load_crl(tmp_path / "ca" / CRL_FILE)
    assert crl.is_signature_valid(ca.key.public_key())
    assert {entry.serial_number for entry in crl} == {old.serial, new.serial}
    again, number = revoke(tmp_path / "ca", "gpu-1")
    assert again == []
    assert number == 1
    assert _crl_number(tmp_path / "ca") == 1
    revoked, number = revoke(tmp_path / "ca", serial_text(other.serial).lower())
    assert [row.name for row in revoked] == ["gpu-2"]
    assert number == 2
    rows = {row.serial: row for row in read_index(tmp_path / "ca").issued}
    assert all(row.revoked_at is not None for row in rows.values())


def test_revoke_by_serial_leaves_the_other_certificates_of_the_name(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca")
    old = issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=tmp_path / "a").issued
    new = issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=tmp_path / "b").issued
    hex_with_colons = ":".join(f"{b:02x}" for b in old.serial.to_bytes(20, "big"))
    revoked, _ = revoke(tmp_path / "ca", hex_with_colons)
    assert [row.serial for row in revoked] == [old.serial]
    rows = {row.serial: row for row in read_index(tmp_path / "ca").issued}
    assert rows[new.serial].revoked_at is None
    assert {e.serial_number for e in load_crl(tmp_path / "ca" / CRL_FILE)} == {old.serial}


def test_revoke_refuses_an_unknown_name_or_serial(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca")
    issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=tmp_path / "a")
    for target in ("gpu-9", "ABCDEF"):
        with pytest.raises(CaError, match="no certificate of that name or serial"):
            revoke(tmp_path / "ca", target)
    assert _crl_number(tmp_path / "ca") == 0


def test_a_lost_crl_is_rewritten_by_the_next_revoke(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca")
    issued = issue_certificate(tmp_path / "ca", "gpu-1", CertRole.NODE, out=tmp_path / "a")
    revoke(tmp_path / "ca", "gpu-1")
    (tmp_path / "ca" / CRL_FILE).unlink()
    assert revoke(tmp_path / "ca", "gpu-1") == ([], 1)
    crl = load_crl(tmp_path / "ca" / CRL_FILE)
    assert [entry.serial_number for entry in crl] == [issued.issued.serial]


def test_a_damaged_index_is_named(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca")
    (tmp_path / "ca" / "index.json").write_text("{")
    with pytest.raises(CaError, match=r"index.json: damaged index"):
        read_index(tmp_path / "ca")
