"""`shoal deploy --ca DIR`: a node certificate per host from the operator's CA, kept while it
is still good (same CA, identity, role and addresses, not revoked, not near expiry), else
issued anew; pushed with the CA certificate and the CRL into `path/tls/`."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509

from config import CaError, CertificateError, HostEntry
from config.tls import (
    CA_CERT,
    CRL_FILE,
    DEFAULT_DAYS,
    CertRole,
    issue_certificate,
    load_certificate,
    load_crl,
    serial_text,
    verify_peer_certificate,
)
from node.errors import DeployError

TLS_DIR = "tls"
RENEW_BEFORE = timedelta(days=30)
"""A host's certificate that expires sooner than this is replaced by the next deploy."""


@dataclass(frozen=True)
class TlsPaths:
    """Where a host's TLS files live (under its deploy path) and the `tls:` block naming them."""

    ca: str
    cert: str
    key: str
    crl: str

    def settings(self) -> dict[str, str]:
        """The node config's `tls:` block."""
        return {"ca": self.ca, "cert": self.cert, "key": self.key, "crl": self.crl}


def tls_paths(root: str) -> TlsPaths:
    """The TLS files of the host whose deploy path is `root`."""
    base = f"{root}/{TLS_DIR}"
    return TlsPaths(f"{base}/ca.crt", f"{base}/node.crt", f"{base}/node.key", f"{base}/crl.pem")


@dataclass(frozen=True)
class NodeTls:
    """A host's TLS material: the CA certificate and CRL (PEM), its certificate, and its key
    when newly issued (None: the host keeps the key it has). `pending`: a dry run, where the
    certificate would be issued but was not."""

    ca_pem: bytes
    crl_pem: bytes
    cert_pem: bytes
    key_pem: bytes | None = field(repr=False)
    serial: str
    not_after: str
    issued: bool
    reason: str
    pending: bool = False


def certificate_sans(entry: HostEntry) -> tuple[str, ...]:
    """The addresses a host's HTTPS server is reached at: internal_ip, the inventory address
    and ssh_host, each once."""
    sans: list[str] = []
    for value in (entry.internal_ip, entry.address, entry.ssh_host):
        if value and value not in sans:
            sans.append(value)
    return tuple(sans)


def _san_values(cert: x509.Certificate) -> set[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    values = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    return values | {dns.lower() for dns in names.get_values_for_type(x509.DNSName)}


def _normal_san(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return value.lower()


def reuse_problem(
    existing_pem: bytes | None,
    has_key: bool,
    name: str,
    sans: tuple[str, ...],
    ca_cert: x509.Certificate,
    crl: x509.CertificateRevocationList,
    now: datetime,
) -> str | None:
    """Why the host's certificate cannot be kept (None: keep it): none or no key on the host,
    another CA, expired or expiring within RENEW_BEFORE, revoked, another identity or role, or
    an address of the host missing from its names."""
    if existing_pem is None or not existing_pem.strip():
        return "the host has no certificate"
    if not has_key:
        return "the host has no key for its certificate"
    try:
        identity = verify_peer_certificate(existing_pem, ca_cert, crl, now)
    except CertificateError as exc:
        return f"its certificate is refused: {exc}"
    except CaError as exc:
        raise DeployError(f"the CA's CRL: {exc}") from exc
    if identity.name != name or identity.role is not CertRole.NODE:
        return f"its certificate names {identity.name} ({identity.role.value}), not {name} (node)"
    if identity.not_after - now < RENEW_BEFORE:
        return f"its certificate expires at {identity.not_after.isoformat()}"
    cert = x509.load_pem_x509_certificate(existing_pem)
    missing = sorted({_normal_san(s) for s in sans} - _san_values(cert))
    if missing:
        return f"its certificate lacks the address(es) {', '.join(missing)}"
    return None


def node_tls(
    ca_dir: Path,
    name: str,
    entry: HostEntry,
    existing_pem: bytes | None,
    has_key: bool,
    *,
    issue: bool = True,
    days: int = DEFAULT_DAYS,
    now: datetime | None = None,
) -> NodeTls:
    """The TLS material of host `name`: its certificate kept when `reuse_problem` finds none,
    else a new node certificate from the CA in `ca_dir` (identity `name`, the host's addresses
    as SANs), recorded in the CA's index; the key never touches this machine's disk beyond a
    private temporary directory. `issue=False` (dry run): nothing is issued, `pending` says
    one would be."""
    moment = now or datetime.now(UTC)
    try:
        ca_cert = load_certificate(ca_dir / CA_CERT)
        crl = load_crl(ca_dir / CRL_FILE)
        ca_pem = (ca_dir / CA_CERT).read_bytes()
        crl_pem = (ca_dir / CRL_FILE).read_bytes()
    except (CaError, OSError) as exc:
        raise DeployError(f"--ca {ca_dir}: {exc}") from exc
    sans = certificate_sans(entry)
    problem = reuse_problem(existing_pem, has_key, name, sans, ca_cert, crl, moment)
    if problem is None and existing_pem is not None:
        cert = x509.load_pem_x509_certificate(existing_pem)
        return NodeTls(
            ca_pem,
            crl_pem,
            existing_pem,
            None,
            serial_text(cert.serial_number),
            cert.not_valid_after_utc.isoformat(),
            issued=False,
            reason="kept: still valid",
        )
    reason = problem or "the host has no certificate"
    if not issue:
        return NodeTls(ca_pem, crl_pem, b"", b"", "", "", True, reason, pending=True)
    with tempfile.TemporaryDirectory(prefix="shoal-deploy-tls-") as out:
        try:
            files = issue_certificate(
                ca_dir, name, CertRole.NODE, out=Path(out), days=days, sans=sans, now=moment
            )
        except CaError as exc:
            raise DeployError(f"--ca {ca_dir}: issuing {name}'s certificate: {exc}") from exc
        key_pem = files.key_path.read_bytes()
        cert_pem = files.cert_path.read_bytes()
    return NodeTls(
        ca_pem,
        crl_pem,
        cert_pem,
        key_pem,
        serial_text(files.issued.serial),
        files.issued.not_after.isoformat(),
        issued=True,
        reason=reason,
    )


def tls_probe_lines(root_var: str = "$r") -> list[str]:
    """Probe-script lines printing the host's certificate (base64, one line) and whether its
    key exists."""
    base = f'"{root_var}"/{TLS_DIR}'
    encoded = f"$(base64 < {base}/node.crt | tr -d '\\n')"
    return [
        f'if [ -f {base}/node.crt ]; then echo "tlscert={encoded}"; fi',
        f"if [ -f {base}/node.key ]; then echo tlskey=yes; fi",
    ]


def decode_probe_cert(text: str) -> bytes | None:
    """The certificate bytes of a probe's `tlscert=` value (None when absent or garbled)."""
    if not text:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
