"""The training process's client of its local daemon: stdlib only (http.client, hmac, ssl), so
`import shoal` works beside a script's own `config.py` or `node.py`.

Where to reach the daemon and how to prove who we are come from the environment the launcher
(or the operator) gives the process: SHOAL_DAEMON_URL (else http://127.0.0.1:SHOAL_P2P_PORT,
port 8770 by default), SHOAL_SECRET_FILE (requests are signed as docs/signing.md says), or
SHOAL_TLS_CERT / SHOAL_TLS_KEY / SHOAL_TLS_CA (a client certificate over TLS 1.3), or nothing
(a dev node without a secret). The signature scheme is config.auth's; a contract test checks
that both sign alike.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import secrets
import socket
import ssl
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shoal.errors import DaemonAnswerError, DaemonUnreachableError, ShoalError

__all__ = ["DEFAULT_TIMEOUT_S", "DaemonClient", "sign", "signature_headers"]

DEFAULT_PORT = 8770
DEFAULT_TIMEOUT_S = 10.0
MIN_SECRET_BYTES = 16
TLS_ENV = ("SHOAL_TLS_CERT", "SHOAL_TLS_KEY", "SHOAL_TLS_CA")
DEFAULT_SENDER = "cli-trainer"
"""The sender a training process signs as (a client, not a node: config's CLIENT_ID_PREFIXES)."""


def sign(secret: bytes, method: str, path_qs: str, timestamp: str, nonce: str, body: bytes) -> str:
    """The HMAC-SHA256 signature of one request, as config.auth.sign_request makes it."""
    digest = hashlib.sha256(body).hexdigest()
    message = "\n".join([method.upper(), path_qs, timestamp, nonce, digest])
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def signature_headers(
    secret: bytes, sender: str, method: str, path_qs: str, body: bytes, now: float
) -> dict[str, str]:
    """The four X-Shoal-* headers that sign one request."""
    timestamp = str(int(now))
    nonce = secrets.token_hex(16)
    return {
        "X-Shoal-Node": sender,
        "X-Shoal-Timestamp": timestamp,
        "X-Shoal-Nonce": nonce,
        "X-Shoal-Signature": sign(secret, method, path_qs, timestamp, nonce, body),
    }


def _read_secret(path: Path) -> bytes:
    """The secret in `path`, refused when group or others may read it (as the daemon does)."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes().strip()
    except OSError as exc:
        raise ShoalError(f"SHOAL_SECRET_FILE: {path}: cannot read the secret file: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ShoalError(
            f"SHOAL_SECRET_FILE: {path} is readable by group or others "
            f"(mode {stat.S_IMODE(mode):o}); run: chmod 600 {path}"
        )
    if len(data) < MIN_SECRET_BYTES:
        raise ShoalError(f"SHOAL_SECRET_FILE: {path}: the secret is shorter than 16 bytes")
    return data


def _tls_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """A TLS 1.3 client context of SHOAL_TLS_CERT/KEY/CA, or None when none is set."""
    given = {name: env.get(name, "") for name in TLS_ENV}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ShoalError(f"{', '.join(missing)} not set: set all of {', '.join(TLS_ENV)} or none")
    cert, key, ca = (Path(given[name]).expanduser() for name in TLS_ENV)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # the daemon is reached by address; its chain is checked
    try:
        context.load_verify_locations(cafile=ca)
        context.load_cert_chain(cert, key)
    except (OSError, ValueError) as exc:
        raise ShoalError(f"{', '.join(TLS_ENV)}: cannot load {cert}, {key}, {ca}: {exc}") from exc
    return context


@dataclass(frozen=True)
class _Target:
    url: str
    scheme: str
    host: str
    port: int


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ShoalError(f"SHOAL_DAEMON_URL {url!r} must look like http://HOST:PORT")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return _Target(url.rstrip("/"), parts.scheme, parts.hostname, port)


class DaemonClient:
    """Blocking JSON requests to one daemon over one kept-alive connection (thread-safe: one
    request at a time). Errors are DaemonUnreachableError or DaemonAnswerError."""

    def __init__(
        self,
        url: str,
        *,
        secret: bytes | None = None,
        sender: str = DEFAULT_SENDER,
        tls: ssl.SSLContext | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if tls is not None and url.startswith("http://"):
            url = "https://" + url.removeprefix("http://")
        self._target = _target(url)
        self._secret = secret
        self._sender = sender
        self._tls = tls
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> DaemonClient:
        """The client of the daemon this process's environment names (module docstring)."""
        env = os.environ if env is None else env
        url = env.get("SHOAL_DAEMON_URL") or (
            f"http://127.0.0.1:{env.get('SHOAL_P2P_PORT') or DEFAULT_PORT}"
        )
        secret_file = env.get("SHOAL_SECRET_FILE")
        secret = _read_secret(Path(secret_file).expanduser()) if secret_file else None
        return cls(url, secret=secret, tls=_tls_context(env), timeout_s=timeout_s)

    @property
    def url(self) -> str:
        return self._target.url

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """The decoded JSON answer of `method path` (None for an empty answer)."""
        status, data = self.exchange(method, path, body, timeout_s=timeout_s)
        if status >= 400:
            raise self._answer_error(status, data)
        return data

    def exchange(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> tuple[int, Any]:
        """(status, decoded JSON or None) of `method path`, whatever the status."""
        raw = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self._secret is not None:
            headers.update(
                signature_headers(self._secret, self._sender, method, path, raw, time.time())
            )
        with self._lock:
            status, answer = self._send(method, path, raw, headers, timeout_s or self.timeout_s)
        if not answer.strip():
            return status, None
        try:
            return status, json.loads(answer)
        except ValueError:
            if status >= 400:
                return status, {"reason": answer[:200].decode(errors="replace")}
            raise DaemonUnreachableError(
                self.url, f"{method} {path} answered invalid JSON: {answer[:200]!r}"
            ) from None

    def close(self) -> None:
        """Close the kept-alive connection (a later request opens another)."""
        with self._lock:
            self._drop()

    def _send(
        self, method: str, path: str, raw: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]:
        for attempt in (0, 1):  # a kept-alive connection the daemon closed is opened again once
            connection = self._connect(timeout_s)
            try:
                connection.request(method, path, body=raw or None, headers=headers)
                response = connection.getresponse()
                return response.status, response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop()
                if attempt:
                    raise DaemonUnreachableError(self.url, str(exc) or type(exc).__name__) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                reason = "timed out" if isinstance(exc, socket.timeout) else str(exc)
                raise DaemonUnreachableError(self.url, reason or type(exc).__name__) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        target = self._target
        if self._connection is None:
            if target.scheme == "https":
                self._connection = http.client.HTTPSConnection(
                    target.host, target.port, timeout=timeout_s, context=self._tls
                )
            else:
                self._connection = http.client.HTTPConnection(
                    target.host, target.port, timeout=timeout_s
                )
        self._connection.timeout = timeout_s
        if self._connection.sock is not None:
            self._connection.sock.settimeout(timeout_s)
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _answer_error(self, status: int, data: Any) -> DaemonAnswerError:
        if isinstance(data, dict):
            code = str(data.get("error") or status)
            reason = str(data.get("reason") or data)
        else:
            code, reason = str(status), str(data)
        return DaemonAnswerError(self.url, status, code, reason)
