"""Identity and role of a certificate, and verify_peer_certificate: valid, expired, not yet
valid, another CA, revoked, no role; and Python's ssl doing mutual TLS 1.3 with issued files."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from config import CaError, CertificateError
from config.tls import (
    CA_CERT,
    CRL_FILE,
    CertRole,
    ClusterCa,
    RefusalReason,
    identity_of,
    init_ca,
    issue_certificate,
    load_certificate,
    load_crl,
    revoke,
    role_of,
    verify_peer_certificate,
)


@dataclass(frozen=True)
class Setup:
    ca: ClusterCa
    other: ClusterCa
    node: x509.Certificate
    operator: x509.Certificate
    root: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("tls")
    ca = init_ca(root / "ca")
    other = init_ca(root / "other")
    issue_certificate(root / "ca", "gpu-1", CertRole.NODE, out=root / "gpu-1", sans=["127.0.0.1"])
    issue_certificate(root / "ca", "alice", CertRole.OPERATOR, out=root / "alice")
    issue_certificate(root / "other", "mallory", CertRole.OPERATOR, out=root / "mallory")
    issue_certificate(root / "ca", "eve", CertRole.OPERATOR, out=root / "eve")
    revoke(root / "ca", "eve")
    return Setup(
        ca=ca,
        other=other,
        node=load_certificate(root / "gpu-1" / "gpu-1.crt"),
        operator=load_certificate(root / "alice" / "alice.crt"),
        root=root,
    )


def _crafted(ca: ClusterCa, attributes: list[x509.NameAttribute[str]]) -> x509.Certificate:
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca.cert.subject)
        .public_key(ca.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(hours=1))
        .sign(ca.key, hashes.SHA256())
    )


def test_a_valid_certificate_gives_its_identity_and_role(setup: Setup) -> None:
    crl = load_crl(setup.root / "ca" / CRL_FILE)
    peer = verify_peer_certificate(setup.node, setup.ca.cert, crl)
    assert (peer.name, peer.role) == ("gpu-1", CertRole.NODE)
    assert peer.serial == setup.node.serial_number
    assert peer.not_after == setup.node.not_valid_after_utc
    der = setup.operator.public_bytes(serialization.Encoding.DER)
    assert verify_peer_certificate(der, setup.ca.cert).role is CertRole.OPERATOR
    pem = setup.operator.public_bytes(serialization.Encoding.PEM)
    assert verify_peer_certificate(pem, setup.ca.cert).name == "alice"


def test_an_expired_certificate_is_refused_naming_it(setup: Setup) -> None:
    later = setup.node.not_valid_after_utc + timedelta(seconds=1)
    with pytest.raises(CertificateError) as caught:
        verify_peer_certificate(setup.node, setup.ca.cert, now=later)
    assert caught.value.identity == "gpu-1"
    assert caught.value.reason == RefusalReason.EXPIRED
    assert "'gpu-1'" in str(caught.value)
    assert "expired" in str(caught.value)


def test_a_not_yet_valid_certificate_is_refused(setup: Setup) -> None:
    earlier = (setup.node.not_valid_before_utc - timedelta(seconds=1)).replace(tzinfo=None)
    with pytest.raises(CertificateError) as caught:
        verify_peer_certificate(setup.node, setup.ca.cert, now=earlier)
    assert caught.value.reason == RefusalReason.NOT_YET_VALID
    assert caught.value.identity == "gpu-1"


def test_a_certificate_of_another_ca_is_refused(setup: Setup) -> None:
    mallory = load_certificate(setup.root / "mallory" / "mallory.crt")
    with pytest.raises(CertificateError) as caught:
        verify_peer_certificate(mallory, setup.ca.cert)
    assert caught.value.reason == RefusalReason.OTHER_CA
    assert caught.value.identity == "mallory"
    assert "not issued by the cluster CA" in str(caught.value)
    same_name = init_ca(setup.root / "twin").cert
    with pytest.raises(CertificateError, match="other_ca"):
        verify_peer_certificate(setup.node, same_name)


def test_a_certificate_forged_with_the_ca_name_is_refused(setup: Setup) -> None:
    forged = (
        x509.CertificateBuilder()
        .subject_name(setup.operator.subject)
        .issuer_name(setup.ca.cert.subject)
        .public_key(setup.other.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.now(UTC) - timedelta(hours=1))
        .not_valid_after(datetime.now(UTC) + timedelta(hours=1))
        .sign(setup.other.key, hashes.SHA256())
    )
    with pytest.raises(CertificateError) as caught:
        verify_peer_certificate(forged, setup.ca.cert)
    assert caught.value.reason == RefusalReason.OTHER_CA


def test_a_revoked_certificate_is_refused(setup: Setup) -> None:
    eve = load_certificate(setup.root / "eve" / "eve.crt")
    crl = load_crl(setup.root / "ca" / CRL_FILE)
    assert verify_peer_certificate(eve, setup.ca.cert).name == "eve"
    with pytest.raises(CertificateError) as caught:
        verify_peer_certificate(eve, setup.ca.cert, crl)
    assert caught.value.reason == RefusalReason.REVOKED
    assert caught.value.identity == "eve"
    assert "revoked at" in str(caught.value)


def test_a_crl_of_another_ca_is_a_local_misconfiguration(setup: Setup) -> None:
    foreign = load_crl(setup.root / "other" / CRL_FILE)
    with pytest.raises(CaError, match="CRL was not signed by the cluster CA"):
        verify_peer_certificate(setup.node, setup.ca.cert, foreign)


def test_a_certificate_without_a_role_or_with_an_unknown_one_is_refused(setup: Setup) -> None:
    cn = x509.NameAttribute(NameOID.COMMON_NAME, "gpu-7")
    cases = {
        "0 OU attributes": [cn],
        "'admin' is not a role": [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "admin"),
            cn,
        ],
    }
    for message, attributes in cases.items():
        cert = _crafted(setup.ca, attributes)
        with pytest.raises(CertificateError, match=message) as caught:
            verify_peer_certificate(cert, setup.ca.cert)
        assert caught.value.reason == RefusalReason.BAD_IDENTITY
        assert caught.value.identity == "gpu-7"
        with pytest.raises(CertificateError):
            role_of(cert)


def test_identity_needs_one_valid_cn(setup: Setup) -> None:
    role = x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "node")
    no_cn = _crafted(setup.ca, [role])
    with pytest.raises(CertificateError, match="0 CN attributes") as caught:
        identity_of(no_cn)
    assert caught.value.identity == "<no CN>"
    bad = _crafted(setup.ca, [role, x509.NameAttribute(NameOID.COMMON_NAME, "a/b")])
    with pytest.raises(CertificateError, match="not a valid identity name"):
        verify_peer_certificate(bad, setup.ca.cert)
    assert identity_of(setup.node) == "gpu-1"
    assert role_of(setup.operator) is CertRole.OPERATOR


def test_bytes_that_are_no_certificate_are_refused(setup: Setup) -> None:
    with pytest.raises(CertificateError, match="not a certificate"):
        verify_peer_certificate(b"garbage", setup.ca.cert)


# Mutual TLS 1.3 with Python's ssl: the issued files are what OpenSSL accepts.


def _server_context(root: Path, crl: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=root / "gpu-1" / CA_CERT)
    if crl:
        context.load_verify_locations(cafile=root / "ca" / CRL_FILE)
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    context.load_cert_chain(root / "gpu-1" / "gpu-1.crt", root / "gpu-1" / "gpu-1.key")
    return context


def _client_context(root: Path, name: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=root / "ca" / CA_CERT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(root / name / f"{name}.crt", root / name / f"{name}.key")
    return context


@dataclass
class Handshake:
    server_peer_der: bytes | None = None
    server_error: BaseException | None = None
    client_version: str | None = None
    client_error: BaseException | None = None


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> Handshake:
    """A TLS handshake over a loopback TCP connection; the server answers one byte."""
    result = Handshake()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]

    def serve() -> None:
        try:
            raw, _ = listener.accept()
            with server.wrap_socket(raw, server_side=True) as tls:
                result.server_peer_der = tls.getpeercert(binary_form=True)
                tls.sendall(b"k")
        except (OSError, ssl.SSLError) as exc:
            result.server_error = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client.wrap_socket(raw, server_hostname=hostname) as tls,
        ):
            result.client_version = tls.version()
            tls.recv(1)
    except (OSError, ssl.SSLError) as exc:
        result.client_error = exc
    finally:
        thread.join(timeout=10)
        listener.close()
    assert not thread.is_alive()
    return result


def test_issued_certificates_do_mutual_tls_13_with_python_ssl(setup: Setup) -> None:
    done = _handshake(_server_context(setup.root), _client_context(setup.root, "alice"), "gpu-1")
    assert done.server_error is None, done.server_error
    assert done.client_error is None, done.client_error
    assert done.client_version == "TLSv1.3"
    assert done.server_peer_der is not None
    peer = verify_peer_certificate(done.server_peer_der, setup.ca.cert)
    assert (peer.name, peer.role) == ("alice", CertRole.OPERATOR)
    by_address = _handshake(
        _server_context(setup.root), _client_context(setup.root, "gpu-1"), "127.0.0.1"
    )
    assert by_address.client_error is None, by_address.client_error


def test_ssl_refuses_a_client_of_another_ca_and_a_wrong_server_name(setup: Setup) -> None:
    done = _handshake(_server_context(setup.root), _client_context(setup.root, "mallory"), "gpu-1")
    assert done.server_peer_der is None
    assert isinstance(done.server_error, ssl.SSLError)
    assert "certificate verify failed" in str(done.server_error)
    wrong = _handshake(_server_context(setup.root), _client_context(setup.root, "alice"), "gpu-2")
    assert isinstance(wrong.client_error, ssl.SSLCertVerificationError)


def test_ssl_honours_the_crl_of_the_ca(setup: Setup) -> None:
    server = _server_context(setup.root, crl=True)
    refused = _handshake(server, _client_context(setup.root, "eve"), "gpu-1")
    assert isinstance(refused.server_error, ssl.SSLError)
    assert "revoked" in str(refused.server_error)
    accepted = _handshake(server, _client_context(setup.root, "alice"), "gpu-1")
    assert accepted.server_error is None, accepted.server_error


def test_importing_config_alone_does_not_load_cryptography() -> None:
    code = "import sys, config; print('cryptography' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "False"
