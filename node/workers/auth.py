"""The worker server's HMAC challenge-response: the server sends a fresh nonce, the caller
answers HMAC-SHA256(cluster secret, label + nonce). Without a secret only loopback may connect,
as for the HTTP API."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from pathlib import Path

from config import read_secret_file

LABEL = b"shoal-workers-v1:"
NONCE_BYTES = 32


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def answer(secret: bytes | None, nonce: bytes) -> str:
    """The caller's answer to `nonce` ("" without a secret)."""
    if secret is None:
        return ""
    return hmac.new(secret, LABEL + nonce, hashlib.sha256).hexdigest()


def verify(secret: bytes | None, nonce: bytes, given: object) -> bool:
    """Whether `given` answers `nonce` for `secret`; anything goes without a secret (the
    server then accepts loopback peers only)."""
    if secret is None:
        return True
    return isinstance(given, str) and hmac.compare_digest(answer(secret, nonce), given)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return host == "localhost"


def load_secret(secret_file: str | Path | None) -> bytes | None:
    """The cluster secret in `secret_file` (config's checks: mode 600, long enough), or None."""
    if secret_file is None:
        return None
    return read_secret_file(Path(secret_file), "worker secret file")
