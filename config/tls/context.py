"""The TLS contexts of a node: TLS 1.3 only, its certificate presented both ways, every peer's
certificate checked against the cluster CA and its CRL. `TlsContexts` holds the current ones and
swaps them when the files change or on SIGHUP, so new handshakes use the new material while the
listener and the connections already open stay up."""

from __future__ import annotations

import dataclasses
import logging
import ssl
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from config.errors import CaError, CertificateError, ConfigError
from config.private import shared_file_problem
from config.tls.identity import (
    CertRole,
    PeerIdentity,
    RefusalReason,
    load_certificate,
    load_crl,
    verify_peer_certificate,
)
from config.tls.store import write_atomic

__all__ = [
    "DEFAULT_CRL_NAME",
    "NO_CHECK_TIME",
    "TlsContexts",
    "TlsFiles",
    "TlsMaterial",
    "crl_number",
    "handshake_refusal",
    "load_material",
]

log = logging.getLogger(__name__)

DEFAULT_CRL_NAME = "tls/crl.pem"
"""Where a node keeps the CRL when `tls.crl` is not set (relative to its data dir)."""
NO_CHECK_TIME = 0x200000
"""OpenSSL's X509_V_FLAG_NO_CHECK_TIME. The server's handshake checks only that a client
certificate chains to the CA; its validity in time and the CRL are checked per request by
`TlsContexts.verify_peer`, which names the identity and the reason (OpenSSL's refusal would
name neither)."""

_VERIFY_CODES = {
    2: RefusalReason.OTHER_CA,  # unable to get issuer certificate
    7: RefusalReason.OTHER_CA,  # certificate signature failure
    9: RefusalReason.NOT_YET_VALID,
    10: RefusalReason.EXPIRED,
    18: RefusalReason.OTHER_CA,  # self-signed certificate
    19: RefusalReason.OTHER_CA,  # self-signed certificate in chain
    20: RefusalReason.OTHER_CA,  # unable to get local issuer certificate
    21: RefusalReason.OTHER_CA,  # unable to verify the first certificate
    23: RefusalReason.REVOKED,
    62: RefusalReason.BAD_IDENTITY,  # hostname mismatch: not the node that was called
}


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """The files of a node's TLS material: the CA certificate, its own certificate and key, and
    the CRL (which may not exist yet: the node then learns one from its peers). `setting` names
    the config section the paths came from, for error messages."""

    ca: Path
    cert: Path
    key: Path
    crl: Path
    crl_required: bool = False
    setting: str = "tls"


@dataclasses.dataclass(frozen=True)
class TlsMaterial:
    """One loaded generation of TLS material and the two contexts made from it."""

    files: TlsFiles
    ca_cert: x509.Certificate
    crl: x509.CertificateRevocationList | None
    own: PeerIdentity
    server: ssl.SSLContext
    client: ssl.SSLContext
    stamps: tuple[tuple[int, int] | None, ...]
    generation: int

    @property
    def crl_number(self) -> int:
        """The CRL's number, -1 without a CRL."""
        return -1 if self.crl is None else crl_number(self.crl)

    def revoked_at(self, serial: int) -> datetime | None:
        """When the CRL in use revoked the certificate with `serial`; None when it did not."""
        if self.crl is None:
            return None
        entry = self.crl.get_revoked_certificate_by_serial_number(serial)
        return None if entry is None else entry.revocation_date_utc


def crl_number(crl: x509.CertificateRevocationList) -> int:
    """The CRLNumber extension of `crl` (0 when it has none)."""
    try:
        return int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except x509.ExtensionNotFound:
        return 0


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size)


def _stamps(files: TlsFiles) -> tuple[tuple[int, int] | None, ...]:
    return tuple(_stamp(path) for path in (files.ca, files.cert, files.key, files.crl))


def _fail(files: TlsFiles, field: str, path: Path, problem: str) -> ConfigError:
    return ConfigError(f"{files.setting}.{field}: {path}: {problem}")


def _base_context(purpose: int) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    return context


def _check_key_private(files: TlsFiles) -> None:
    """Refuse a key file readable by group or others, as the secret file is (a missing one is
    named when the certificate is loaded with it)."""
    try:
        mode = files.key.stat().st_mode
    except OSError:
        return
    shared = shared_file_problem(files.key, mode, "the node's TLS key")
    if shared is not None:
        raise ConfigError(f"{files.setting}.key: {shared}")


def load_material(
    files: TlsFiles, *, generation: int = 0, now: datetime | None = None
) -> TlsMaterial:
    """Load the CA, the node's certificate and key, and the CRL, and make the server and client
    contexts. ConfigError naming the setting (`tls.cert`, ...) and the file when a file is
    missing, unreadable, not what it should be, or when the node's own certificate is not a
    valid `node` certificate of that CA (other CA, expired, revoked, another role)."""
    stamps = _stamps(files)
    _check_key_private(files)
    try:
        ca_cert = load_certificate(files.ca)
    except CaError as exc:
        raise ConfigError(f"{files.setting}.ca: {exc}") from exc
    crl = None
    if files.crl.exists() or files.crl_required:
        try:
            crl = load_crl(files.crl)
        except CaError as exc:
            raise ConfigError(f"{files.setting}.crl: {exc}") from exc
    try:
        own_cert = load_certificate(files.cert)
    except CaError as exc:
        raise ConfigError(f"{files.setting}.cert: {exc}") from exc
    try:
        own = verify_peer_certificate(own_cert, ca_cert, crl, now)
    except CertificateError as exc:
        raise _fail(files, "cert", files.cert, f"{exc}") from exc
    except CaError as exc:
        raise _fail(files, "crl", files.crl, f"{exc}") from exc
    if own.role is not CertRole.NODE:
        raise _fail(
            files,
            "cert",
            files.cert,
            f"a {own.role.value} certificate; a node serves with a node certificate"
            f" (`shoal ca issue {own.name} --role node`)",
        )
    server, client = _contexts(files, ca_cert, crl)
    return TlsMaterial(
        files=files,
        ca_cert=ca_cert,
        crl=crl,
        own=own,
        server=server,
        client=client,
        stamps=stamps,
        generation=generation,
    )


def _contexts(
    files: TlsFiles, ca_cert: x509.Certificate, crl: x509.CertificateRevocationList | None
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server context (client certificates asked for, their validity checked per request)
    and the client context (the server's chain, name and, with a CRL, revocation checked), both
    presenting the node's certificate."""
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    server = _base_context(ssl.PROTOCOL_TLS_SERVER)
    client = _base_context(ssl.PROTOCOL_TLS_CLIENT)
    for context in (server, client):
        try:
            context.load_cert_chain(files.cert, files.key)
        except OSError as exc:  # ssl.SSLError is an OSError: a key that is not the cert's
            raise _fail(
                files, "key", files.key, f"cannot load it with {files.cert}: {exc}"
            ) from exc
        context.load_verify_locations(cadata=ca_pem)
    server.verify_mode = ssl.CERT_OPTIONAL
    server.verify_flags = ssl.VerifyFlags(int(server.verify_flags) | NO_CHECK_TIME)
    client.verify_mode = ssl.CERT_REQUIRED
    client.check_hostname = True
    if crl is not None:
        client.load_verify_locations(cafile=files.crl)
        client.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    return server, client


def handshake_refusal(exc: BaseException) -> tuple[RefusalReason, str] | None:
    """The refusal reason and OpenSSL's message of a failed TLS handshake whose cause was the
    other side's certificate (SSLCertVerificationError), or None for any other failure."""
    if not isinstance(exc, ssl.SSLCertVerificationError):
        return None
    code = int(getattr(exc, "verify_code", 0) or 0)
    message = str(getattr(exc, "verify_message", "") or exc)
    return _VERIFY_CODES.get(code, RefusalReason.OTHER_CA), message


class TlsContexts:
    """The current TLS material of a node. `server_context()` and `client_context()` answer
    the contexts of the newest generation; `reload()` (SIGHUP) and `reload_if_changed()` (the
    files' mtimes) load a new generation and keep the old one when the new files are bad, so a
    half-copied certificate never stops a serving node."""

    def __init__(
        self,
        files: TlsFiles,
        *,
        now: Callable[[], datetime | None] = lambda: None,
    ) -> None:
        self._now = now
        self._material = load_material(files, now=now())
        self.reload_errors: list[str] = []
        """Why the newest reloads failed (the last few), for the node's health."""

    @property
    def material(self) -> TlsMaterial:
        return self._material

    @property
    def files(self) -> TlsFiles:
        return self._material.files

    def server_context(self) -> ssl.SSLContext:
        """The context new server handshakes use (TLS 1.3, client certificate optional at the
        TLS layer and checked per request, verified against the CA)."""
        return self._material.server

    def client_context(self) -> ssl.SSLContext:
        """The context new client handshakes use (TLS 1.3, this node's certificate presented,
        the server's verified against the CA and CRL; pass `server_hostname=` the node id)."""
        return self._material.client

    def verify_peer(self, cert_der: bytes) -> PeerIdentity:
        """A peer's certificate (DER) checked against the current CA and CRL now:
        CertificateError naming its identity and the reason when refused."""
        material = self._material
        return verify_peer_certificate(cert_der, material.ca_cert, material.crl, self._now())

    def reload(self, why: str = "SIGHUP") -> bool:
        """Load the files again; True when a new generation is in use. A failure is logged
        naming the file and the old material stays."""
        try:
            material = load_material(
                self._material.files, generation=self._material.generation + 1, now=self._now()
            )
        except ConfigError as exc:
            message = "; ".join(exc.problems)
            self.reload_errors = [*self.reload_errors[-4:], message]
            log.error("TLS reload (%s) failed, still using the old material: %s", why, message)
            return False
        self._material = material
        self.reload_errors = []
        log.info(
            "TLS material reloaded (%s): %s serial %X, CRL number %d",
            why,
            material.own.name,
            material.own.serial,
            material.crl_number,
        )
        return True

    def changed(self) -> bool:
        """Whether a file's mtime or size differs from the generation in use."""
        return _stamps(self._material.files) != self._material.stamps

    def reload_if_changed(self) -> bool:
        """Reload when a file changed; True when a new generation is in use."""
        return self.changed() and self.reload("files changed")

    def crl_pem(self) -> bytes | None:
        """The CRL in use, PEM, or None."""
        crl = self._material.crl
        return None if crl is None else crl.public_bytes(serialization.Encoding.PEM)

    def install_crl(self, pem: bytes, source: str) -> bool:
        """Take a CRL learnt from `source` when the CA signed it and its number is higher than
        the one in use: write it to the CRL file (atomically) and reload. False otherwise (an
        older or equal number, or a CRL this CA did not sign, which is logged)."""
        try:
            crl = x509.load_pem_x509_crl(pem)
        except ValueError as exc:
            log.warning("CRL from %s is not a PEM CRL (%s); ignored", source, exc)
            return False
        material = self._material
        if crl_number(crl) <= material.crl_number:
            return False
        public = material.ca_cert.public_key()
        try:
            signed = crl.issuer == material.ca_cert.subject and crl.is_signature_valid(public)  # type: ignore[arg-type]
        except TypeError:
            signed = False
        if not signed:
            log.warning("CRL from %s was not signed by this cluster's CA; ignored", source)
            return False
        path = material.files.crl
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(path, crl.public_bytes(serialization.Encoding.PEM))
        except (OSError, CaError) as exc:
            log.error("cannot store the CRL from %s in %s: %s", source, path, exc)
            return False
        log.warning(
            "CRL number %d from %s installed (was %d): %d certificates revoked",
            crl_number(crl),
            source,
            material.crl_number,
            len(list(crl)),
        )
        return self.reload(f"CRL number {crl_number(crl)} from {source}")
