"""The cluster CA in a directory: make it (`ca.key` mode 600, `ca.crt`), issue certificates,
revoke them and sign the CRL (`crl.pem`). What `shoal ca` runs; the index lives in `store`.

Keys are EC P-256 and signatures ECDSA-SHA256: OpenSSL accepts them for TLS 1.3 and 1.2, client
and server auth, in every build (FIPS included), and browsers accept them for the dashboard,
which Ed25519 certificates are not."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from config.errors import CaError
from config.fields import is_valid_node_id
from config.tls.identity import IDENTITY_ATTRIBUTE, ROLE_ATTRIBUTE, CertRole, load_certificate
from config.tls.store import (
    CaIndex,
    IssuedCertificate,
    locked,
    make_dir,
    read_index,
    write_atomic,
    write_index,
)

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CRL_DAYS",
    "CRL_FILE",
    "DEFAULT_CA_DAYS",
    "DEFAULT_DAYS",
    "MAX_DAYS",
    "ClusterCa",
    "IssuedFiles",
    "init_ca",
    "issue_certificate",
    "load_ca",
    "parse_san",
    "revoke",
]

CA_KEY = "ca.key"
CA_CERT = "ca.crt"
CRL_FILE = "crl.pem"
DEFAULT_CA_DAYS = 3650
DEFAULT_DAYS = 365
MAX_DAYS = 3650
CRL_DAYS = 365
"""A CRL's nextUpdate is this many days after it was signed; every revoke signs a new one."""
_BACKDATE = timedelta(minutes=5)
"""notBefore lies this far in the past, so a peer whose clock is a little behind accepts it."""
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*$"
)


@dataclasses.dataclass(frozen=True)
class ClusterCa:
    """A loaded CA: its directory, key and self-signed certificate."""

    directory: Path
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


@dataclasses.dataclass(frozen=True)
class IssuedFiles:
    """What `issue_certificate` wrote, and the index row it added."""

    key_path: Path
    cert_path: Path
    ca_path: Path
    issued: IssuedCertificate


def _check_days(days: int, what: str) -> None:
    if not 1 <= days <= MAX_DAYS:
        raise CaError(f"--days {days}: {what} must be valid for 1 to {MAX_DAYS} days")


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def init_ca(
    directory: Path,
    *,
    force: bool = False,
    days: int = DEFAULT_CA_DAYS,
    now: datetime | None = None,
) -> ClusterCa:
    """Make a cluster CA in `directory` (created with mode 700): an EC P-256 key (`ca.key`, mode
    600), a self-signed certificate valid `days` (`ca.crt`), an empty index and a signed empty
    CRL. Refuses (CaError) when the dir already holds a CA, unless `force`, which replaces it
    and its index: every certificate of the old CA stops verifying."""
    _check_days(days, "the CA")
    make_dir(directory, "the CA dir")
    with locked(directory):
        existing = [name for name in (CA_KEY, CA_CERT) if (directory / name).exists()]
        if existing and not force:
            raise CaError(
                f"{directory} already holds a CA ({', '.join(existing)}): use it, pick another"
                " --dir, or pass --force to replace it (its certificates stop verifying)"
            )
        moment = now or datetime.now(UTC)
        key = _new_key()
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "shoal"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"shoal cluster CA {secrets.token_hex(4)}"),
            ]
        )
        public = key.public_key()
        cert = (
            _builder(subject, subject, public, moment, moment + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(signs=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        ca = ClusterCa(directory=directory, key=key, cert=cert)
        write_atomic(directory / CA_KEY, _key_pem(key), 0o600)
        write_atomic(directory / CA_CERT, _cert_pem(cert))
        index = CaIndex()
        write_index(directory, index)
        _write_crl(ca, index, moment)
        return ca


def load_ca(directory: Path) -> ClusterCa:
    """The CA in `directory`; CaError saying to run `shoal ca init` when there is none."""
    if directory.exists() and not directory.is_dir():
        raise CaError(f"{directory}: not a directory; --dir names the CA's directory")
    key_path, cert_path = directory / CA_KEY, directory / CA_CERT
    if not key_path.exists() or not cert_path.exists():
        raise CaError(f"no cluster CA in {directory}: run `shoal ca init --dir {directory}` first")
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise CaError(f"{key_path}: cannot read the CA key: {exc.strerror or exc}") from exc
    except (ValueError, TypeError) as exc:
        raise CaError(f"{key_path}: not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CaError(f"{key_path}: not an EC key; make the CA with `shoal ca init`")
    cert = load_certificate(cert_path)
    if cert.public_key() != key.public_key():
        raise CaError(f"{cert_path} does not belong to {key_path}: restore the pair from backup")
    return ClusterCa(directory=directory, key=key, cert=cert)


def _write_crl(ca: ClusterCa, index: CaIndex, moment: datetime) -> x509.CertificateRevocationList:
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.cert.subject)
        .last_update(moment)
        .next_update(moment + timedelta(days=CRL_DAYS))
        .add_extension(x509.CRLNumber(index.crl_number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    for row in index.issued:
        if row.revoked_at is not None:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(row.serial)
                .revocation_date(row.revoked_at)
                .build()
            )
    crl = builder.sign(ca.key, hashes.SHA256())
    write_atomic(ca.directory / CRL_FILE, crl.public_bytes(serialization.Encoding.PEM))
    return crl


def _crl_number_on_disk(directory: Path) -> int | None:
    """The number of `crl.pem`, or None when it is missing or unreadable: a crash between the
    index write and the CRL write of a revoke is repaired by the next revoke."""
    try:
        crl = x509.load_pem_x509_crl((directory / CRL_FILE).read_bytes())
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except (OSError, ValueError, x509.ExtensionNotFound):
        return None


def parse_san(text: str) -> x509.GeneralName:
    """A `--san` value: an IPv4 or IPv6 address, else a DNS name (`*.` allowed first)."""
    value = text.strip()
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not _DNS_NAME.match(value):
        raise CaError(f"--san {text!r}: neither an IP address nor a DNS name")
    return x509.DNSName(value.lower())


def issue_certificate(
    directory: Path,
    name: str,
    role: CertRole,
    *,
    out: Path,
    days: int = DEFAULT_DAYS,
    sans: Sequence[str] = (),
    force: bool = False,
    now: datetime | None = None,
) -> IssuedFiles:
    """Issue an EC P-256 key and a certificate for identity `name` (CN, and a DNS SAN) with
    `role` (the OU), valid `days`; extended key usage serverAuth+clientAuth for a node (whose
    `sans`, addresses or DNS names, are added so its HTTPS server can be verified), clientAuth
    for an operator or reader. Writes `name.key` (600), `name.crt`, `ca.crt` (and for an
    operator or reader the CA's current `crl.pem`) into `out` and records the certificate in
    the index. Refuses (CaError)
    a bad name, days beyond MAX_DAYS or the CA's own expiry, SANs for a non-node role, or an
    existing `name.key` in `out` unless `force`."""
    alt_names = _leaf_names(name, role, sans, days)
    ca = load_ca(directory)
    moment = now or datetime.now(UTC)
    not_after = moment + timedelta(days=days)
    if not_after > ca.cert.not_valid_after_utc:
        left = (ca.cert.not_valid_after_utc - moment).days
        raise CaError(
            f"--days {days}: the CA expires at {ca.cert.not_valid_after_utc.isoformat()};"
            f" use --days {left} or less, or make a new CA"
        )
    make_dir(out, "--out")
    key_path, cert_path = out / f"{name}.key", out / f"{name}.crt"
    if key_path.exists() and not force:
        raise CaError(f"{key_path} exists: pick another --out, or pass --force to replace it")
    key = _new_key()
    cert = _leaf_certificate(ca, key, name, role, alt_names, moment, not_after)
    issued = IssuedCertificate(
        serial=cert.serial_number,
        name=name,
        role=role,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
    )
    with locked(directory):
        index = read_index(directory)
        write_index(directory, dataclasses.replace(index, issued=(*index.issued, issued)))
    write_atomic(key_path, _key_pem(key), 0o600)
    write_atomic(cert_path, _cert_pem(cert))
    write_atomic(out / CA_CERT, _cert_pem(ca.cert))
    if role is not CertRole.NODE and (directory / CRL_FILE).exists():
        # a command's default CRL: crl.pem beside its ca.crt (a node learns CRLs by itself)
        write_atomic(out / CRL_FILE, (directory / CRL_FILE).read_bytes())
    return IssuedFiles(key_path=key_path, cert_path=cert_path, ca_path=out / CA_CERT, issued=issued)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public: ec.EllipticCurvePublicKey,
    moment: datetime,
    not_after: datetime,
) -> x509.CertificateBuilder:
    """A certificate's common part: names, key, a random serial, valid from a little before
    `moment` (clock skew between hosts) until `not_after`."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(moment - _BACKDATE)
        .not_valid_after(not_after)
    )


def _key_usage(*, signs: bool) -> x509.KeyUsage:
    """Digital signatures only; with `signs` (the CA) also certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs,
        crl_sign=signs,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf_names(
    name: str, role: CertRole, sans: Sequence[str], days: int
) -> list[x509.GeneralName]:
    """Check the identity name, days and SANs of a certificate to issue; its SAN list (the
    name as a DNS name first)."""
    if not is_valid_node_id(name):
        raise CaError(
            f"{name!r} is not a valid identity name: use 1 to 63 letters, digits, '.', '_'"
            " or '-', starting with a letter or digit"
        )
    if name.lower() == "ca":
        raise CaError("'ca' is reserved: its files would collide with ca.crt; pick another name")
    _check_days(days, "a certificate")
    if sans and role is not CertRole.NODE:
        raise CaError(f"--san is for node certificates; a {role.value} certificate has none")
    alt_names: list[x509.GeneralName] = [x509.DNSName(name.lower())]
    for text in sans:
        general = parse_san(text)
        if general not in alt_names:
            alt_names.append(general)
    return alt_names


def _leaf_certificate(
    ca: ClusterCa,
    key: ec.EllipticCurvePrivateKey,
    name: str,
    role: CertRole,
    alt_names: list[x509.GeneralName],
    moment: datetime,
    not_after: datetime,
) -> x509.Certificate:
    """The certificate of identity `name` with `role`, signed by the CA: serverAuth and
    clientAuth for a node, clientAuth for the others."""
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role is CertRole.NODE:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "shoal"),
            x509.NameAttribute(ROLE_ATTRIBUTE, role.value),
            x509.NameAttribute(IDENTITY_ATTRIBUTE, name),
        ]
    )
    public = key.public_key()
    return (
        _builder(subject, ca.cert.subject, public, moment, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )


def _parse_serial(text: str) -> int | None:
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    try:
        return int(digits, 16) if digits else None
    except ValueError:
        return None


def revoke(
    directory: Path, target: str, *, now: datetime | None = None
) -> tuple[list[IssuedCertificate], int]:
    """Revoke `target`: every unrevoked certificate of that name when it is a name in the index,
    else the one certificate with that serial (hex, as `shoal ca list` prints it; `0x` and `:`
    allowed). Signs a new `crl.pem` with the next CRL number when anything was revoked. Returns
    the certificates revoked now (empty when all were revoked before) and the CRL number in
    force. CaError when no certificate has that name or serial."""
    ca = load_ca(directory)
    moment = now or datetime.now(UTC)
    with locked(directory):
        index = read_index(directory)
        by_name = [row for row in index.issued if row.name == target]
        if by_name:
            chosen = by_name
        else:
            serial = _parse_serial(target)
            chosen = [row for row in index.issued if row.serial == serial]
        if not chosen:
            raise CaError(
                f"{target!r}: no certificate of that name or serial was issued by the CA in"
                f" {directory}; see `shoal ca list --dir {directory}`"
            )
        fresh = [row for row in chosen if row.revoked_at is None]
        if not fresh:
            if _crl_number_on_disk(directory) != index.crl_number:
                _write_crl(ca, index, moment)
            return [], index.crl_number
        serials = {row.serial for row in fresh}
        revoked_now = [dataclasses.replace(row, revoked_at=moment) for row in fresh]
        rows = tuple(
            dataclasses.replace(row, revoked_at=moment) if row.serial in serials else row
            for row in index.issued
        )
        updated = CaIndex(crl_number=index.crl_number + 1, issued=rows)
        write_index(directory, updated)
        _write_crl(ca, updated, moment)
        return revoked_now, updated.crl_number
