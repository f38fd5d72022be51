"""An operator's proof that travels with a call a node forwards for it: the command signs each
request it sends (not GETs) with its certificate's key, over the method, path and query, body,
time, nonce and the node it asked; the node it asked passes the proof on, and the node that acts
(the coordinator, the node asked to leave) checks it against the CA and the CRL and acts as the
operator, never because a header names one."""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from config.errors import AuthError, ConfigError
from config.tls.identity import CertRole, PeerIdentity, load_certificate

__all__ = [
    "PROOF_HEADERS",
    "Prover",
    "operator_prover",
    "proof_message",
    "verify_operator_proof",
]

HEADER_CERT = "X-Shoal-Operator-Cert"
HEADER_SIGNATURE = "X-Shoal-Operator-Signature"
HEADER_TIMESTAMP = "X-Shoal-Operator-Timestamp"
HEADER_NONCE = "X-Shoal-Operator-Nonce"
HEADER_TARGET = "X-Shoal-Operator-Target"
PROOF_HEADERS = (HEADER_CERT, HEADER_SIGNATURE, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_TARGET)
"""The headers of an operator's proof (a request may carry a cluster signature beside them)."""
PROOF_V1 = "shoal-operator-v1"

Prover = Callable[[str, str, bytes, str], dict[str, str]]
"""(method, path with query, body, the node asked) -> the proof's headers."""


def proof_message(
    method: str, path_qs: str, timestamp: str, nonce: str, body: bytes, target: str
) -> bytes:
    """What an operator's proof signs: one line each, joined by \\n."""
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([PROOF_V1, method.upper(), path_qs, timestamp, nonce, digest, target]).encode()


def operator_prover(cert: Path, key: Path) -> Prover:
    """A Prover signing with the key of the certificate `cert` (ECDSA P-256, SHA-256);
    ConfigError naming the files when they do not load."""
    try:
        der = load_certificate(cert).public_bytes(serialization.Encoding.DER)
        private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"SHOAL_TLS_CERT, SHOAL_TLS_KEY: {cert}, {key}: {exc}") from exc
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"SHOAL_TLS_KEY: {key}: not an EC key (shoal ca issue makes P-256)")
    cert_text = base64.b64encode(der).decode()

    def prove(method: str, path_qs: str, body: bytes, target: str) -> dict[str, str]:
        timestamp, nonce = str(int(time.time())), secrets.token_hex(16)
        message = proof_message(method, path_qs, timestamp, nonce, body, target)
        signature = private.sign(message, ec.ECDSA(hashes.SHA256()))
        return {
            HEADER_CERT: cert_text,
            HEADER_SIGNATURE: base64.b64encode(signature).decode(),
            HEADER_TIMESTAMP: timestamp,
            HEADER_NONCE: nonce,
            HEADER_TARGET: target,
        }

    return prove


def verify_operator_proof(
    headers: Mapping[str, str],
    method: str,
    path_qs: str,
    body: bytes,
    verify_certificate: Callable[[bytes], PeerIdentity],
    *,
    seen: Callable[[str], bool],
    now: float,
    skew_s: float,
) -> PeerIdentity:
    """The operator whose proof `headers` hold, for this method, path, query and body:
    its certificate accepted now by `verify_certificate` (the CA, the CRL; CertificateError
    otherwise) with the role operator, its signature good, its time within `skew_s`, its nonce
    new (`seen` remembers it). AuthError naming what was wrong otherwise."""
    try:
        der = base64.b64decode(headers[HEADER_CERT], validate=True)
        signature = base64.b64decode(headers[HEADER_SIGNATURE], validate=True)
        timestamp, nonce = headers[HEADER_TIMESTAMP], headers[HEADER_NONCE]
        target = headers[HEADER_TARGET]
    except (KeyError, binascii.Error, ValueError) as exc:
        raise AuthError(f"an operator's proof needs {', '.join(PROOF_HEADERS)}") from exc
    identity = verify_certificate(der)
    if identity.role is not CertRole.OPERATOR:
        raise AuthError(
            f"the proof is of {identity.name!r}, role {identity.role.value}: not an operator"
        )
    if not timestamp.isdigit() or abs(now - int(timestamp)) > skew_s:
        raise AuthError(f"the operator's proof is not of the last {skew_s:.0f} s")
    public = load_certificate_der_key(der)
    message = proof_message(method, path_qs, timestamp, nonce, body, target)
    try:
        public.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise AuthError("the operator's proof does not sign this request") from exc
    if seen(nonce):
        raise AuthError("the operator's proof was used before (a replay)")
    return identity


def load_certificate_der_key(der: bytes) -> ec.EllipticCurvePublicKey:
    from cryptography import x509

    key = x509.load_der_x509_certificate(der).public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise AuthError("the operator's certificate holds no EC key")
    return key
