"""Who a certificate names and what it may do: the identity is the subject's one CN, the role its
one OU (`node`, `operator` or `reader`); and the check of a peer's certificate against the
cluster CA and its CRL that the TLS transport runs on every peer."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPublicKeyTypes
from cryptography.x509.oid import NameOID

from config.errors import CaError, CertificateError
from config.fields import is_valid_node_id

__all__ = [
    "IDENTITY_ATTRIBUTE",
    "ROLE_ATTRIBUTE",
    "CertRole",
    "PeerIdentity",
    "RefusalReason",
    "identity_of",
    "load_certificate",
    "load_crl",
    "role_of",
    "serial_text",
    "verify_peer_certificate",
]

IDENTITY_ATTRIBUTE = NameOID.COMMON_NAME
"""The subject attribute that holds a certificate's identity (exactly one)."""
ROLE_ATTRIBUTE = NameOID.ORGANIZATIONAL_UNIT_NAME
"""The subject attribute that holds a certificate's role (exactly one, a `CertRole` value).
An OU rather than a private-OID extension: Python's `ssl` shows it in `getpeercert()`, and
`openssl x509 -subject` prints it, so every tool sees the role without parsing DER."""
NO_CN = "<no CN>"


class CertRole(StrEnum):
    """What an identity may do: `node` (peer calls), `operator` (everything the CLI does),
    `reader` (GET routes only)."""

    NODE = "node"
    OPERATOR = "operator"
    READER = "reader"


class RefusalReason(StrEnum):
    """Why a peer certificate was refused; the `reason` label of `shoal_tls_refused_total`."""

    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    OTHER_CA = "other_ca"
    REVOKED = "revoked"
    BAD_IDENTITY = "bad_identity"


@dataclasses.dataclass(frozen=True)
class PeerIdentity:
    """A verified certificate's identity and role, with its serial and end of validity."""

    name: str
    role: CertRole
    serial: int
    not_after: datetime


def serial_text(serial: int) -> str:
    """A serial number as `shoal ca list` prints it and `shoal ca revoke` takes it: uppercase
    hex without separators (what `openssl x509 -serial` prints after `serial=`)."""
    return f"{serial:X}"


def _claimed_name(cert: x509.Certificate) -> str:
    values = cert.subject.get_attributes_for_oid(IDENTITY_ATTRIBUTE)
    return str(values[0].value) if len(values) == 1 else NO_CN


def identity_of(cert: x509.Certificate) -> str:
    """The identity a certificate names: its subject's one CN, a valid node id (letters, digits,
    `.`, `_`, `-`; 1 to 63 characters). CertificateError (bad_identity) otherwise. This does not
    check who signed it: use `verify_peer_certificate` for a peer's certificate."""
    values = cert.subject.get_attributes_for_oid(IDENTITY_ATTRIBUTE)
    if len(values) != 1:
        raise CertificateError(
            _claimed_name(cert),
            RefusalReason.BAD_IDENTITY,
            f"the subject has {len(values)} CN attributes; a shoal certificate has exactly one",
        )
    name = str(values[0].value)
    if not is_valid_node_id(name):
        raise CertificateError(
            name, RefusalReason.BAD_IDENTITY, "the CN is not a valid identity name"
        )
    return name


def role_of(cert: x509.Certificate) -> CertRole:
    """The role a certificate records: its subject's one OU, one of `node`, `operator`,
    `reader`. CertificateError (bad_identity) otherwise. This does not check who signed it."""
    values = cert.subject.get_attributes_for_oid(ROLE_ATTRIBUTE)
    if len(values) != 1:
        raise CertificateError(
            _claimed_name(cert),
            RefusalReason.BAD_IDENTITY,
            f"the subject has {len(values)} OU attributes; a shoal certificate has exactly one,"
            " its role",
        )
    value = str(values[0].value)
    try:
        return CertRole(value)
    except ValueError:
        known = ", ".join(role.value for role in CertRole)
        raise CertificateError(
            _claimed_name(cert),
            RefusalReason.BAD_IDENTITY,
            f"the OU {value!r} is not a role (one of {known})",
        ) from None


def _as_certificate(cert: x509.Certificate | bytes) -> x509.Certificate:
    if isinstance(cert, x509.Certificate):
        return cert
    try:
        if cert.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(cert)
        return x509.load_der_x509_certificate(cert)
    except ValueError as exc:
        raise CertificateError(
            NO_CN, RefusalReason.BAD_IDENTITY, f"not a certificate: {exc}"
        ) from exc


def _utc(moment: datetime | None) -> datetime:
    if moment is None:
        return datetime.now(UTC)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _signed_by(crl: x509.CertificateRevocationList, ca_cert: x509.Certificate) -> bool:
    issuer_key = cast(CertificateIssuerPublicKeyTypes, ca_cert.public_key())
    try:
        return crl.is_signature_valid(issuer_key)
    except TypeError:  # a CA key type that cannot sign, so it did not sign this CRL
        return False


def verify_peer_certificate(
    cert: x509.Certificate | bytes,
    ca_cert: x509.Certificate,
    crl: x509.CertificateRevocationList | None = None,
    now: datetime | None = None,
) -> PeerIdentity:
    """Check a peer's certificate (an object, or its DER or PEM bytes) and return its identity
    and role. Checked in this order, the first failure raising CertificateError naming the
    certificate's identity and the reason: signed by `ca_cert` (other_ca), valid at `now`
    (default the current time; a naive datetime is UTC) (not_yet_valid, expired), not on `crl`
    (revoked), one valid CN and one known role OU (bad_identity). A `crl` that `ca_cert` did not
    sign is this node's own misconfiguration: CaError, not a refusal of the peer."""
    certificate = _as_certificate(cert)
    claimed = _claimed_name(certificate)
    serial = serial_text(certificate.serial_number)
    ca_name = _claimed_name(ca_cert)
    try:
        certificate.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise CertificateError(
            claimed,
            RefusalReason.OTHER_CA,
            f"serial {serial} was not issued by the cluster CA {ca_name!r}"
            f" (its issuer is {certificate.issuer.rfc4514_string()!r})",
        ) from exc
    moment = _utc(now)
    if moment < certificate.not_valid_before_utc:
        raise CertificateError(
            claimed,
            RefusalReason.NOT_YET_VALID,
            f"serial {serial} is valid from {certificate.not_valid_before_utc.isoformat()},"
            f" it is {moment.isoformat()} (check this host's clock)",
        )
    if moment > certificate.not_valid_after_utc:
        raise CertificateError(
            claimed,
            RefusalReason.EXPIRED,
            f"serial {serial} expired at {certificate.not_valid_after_utc.isoformat()}"
            " (issue a new one with `shoal ca issue`)",
        )
    if crl is not None:
        if crl.issuer != ca_cert.subject or not _signed_by(crl, ca_cert):
            raise CaError(
                f"the CRL was not signed by the cluster CA {ca_name!r}: use the crl.pem of the"
                " CA dir that holds this ca.crt"
            )
        entry = crl.get_revoked_certificate_by_serial_number(certificate.serial_number)
        if entry is not None:
            raise CertificateError(
                claimed,
                RefusalReason.REVOKED,
                f"serial {serial} was revoked at {entry.revocation_date_utc.isoformat()}",
                certificate.serial_number,
            )
    return PeerIdentity(
        name=identity_of(certificate),
        role=role_of(certificate),
        serial=certificate.serial_number,
        not_after=certificate.not_valid_after_utc,
    )


def load_certificate(path: Path) -> x509.Certificate:
    """The PEM certificate in `path`; CaError naming the file when it is missing or not one."""
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as exc:
        raise CaError(f"{path}: cannot read the certificate: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise CaError(f"{path}: not a PEM certificate ({exc})") from exc


def load_crl(path: Path) -> x509.CertificateRevocationList:
    """The PEM CRL in `path`; CaError naming the file when it is missing or not one."""
    try:
        return x509.load_pem_x509_crl(path.read_bytes())
    except OSError as exc:
        raise CaError(f"{path}: cannot read the CRL: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise CaError(f"{path}: not a PEM CRL ({exc})") from exc
