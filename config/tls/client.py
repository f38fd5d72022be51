"""The TLS identity of a client that is not a node (`shoal` commands, the job client): an
operator's or reader's certificate named by SHOAL_TLS_CERT, SHOAL_TLS_KEY and SHOAL_TLS_CA.
Only `ssl`: a command that presents a certificate does not load `cryptography`."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path

from config.errors import ConfigError
from config.private import shared_file_problem

__all__ = ["TLS_CRL_ENV", "TLS_ENV", "client_scheme", "operator_context", "server_name"]

TLS_ENV = ("SHOAL_TLS_CERT", "SHOAL_TLS_KEY", "SHOAL_TLS_CA")
"""The certificate (operator or reader, from `shoal ca issue`), its key, the cluster CA."""
TLS_CRL_ENV = "SHOAL_TLS_CRL"
"""The CRL a command checks servers against; default `crl.pem` beside SHOAL_TLS_CA."""
CRL_NAME = "crl.pem"


def _crl_of(env: Mapping[str, str], ca: Path) -> Path | None:
    given = env.get(TLS_CRL_ENV, "")
    if given:
        return Path(given).expanduser()
    beside = ca.with_name(CRL_NAME)
    return beside if beside.exists() else None


def operator_context(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """A TLS 1.3 client context presenting the certificate SHOAL_TLS_CERT with the key
    SHOAL_TLS_KEY and trusting the CA SHOAL_TLS_CA; None when none of them is set. The server
    must hold a certificate of that CA, not revoked by the CRL of SHOAL_TLS_CRL (default:
    `crl.pem` beside the CA, when there is one), that names the node asked: the handshake
    checks the server_hostname each connection gives (the URL's host, or the node id the
    caller knows: `server_name`). ConfigError naming the variable and the file otherwise."""
    env = os.environ if env is None else env
    given = {var: env.get(var, "") for var in TLS_ENV}
    if not any(given.values()):
        return None
    missing = [var for var, value in given.items() if not value]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not set: a client certificate needs SHOAL_TLS_CERT, "
            "SHOAL_TLS_KEY and SHOAL_TLS_CA (set all three, or none)"
        )
    cert, key, ca = (Path(given[var]).expanduser() for var in TLS_ENV)
    try:
        shared = shared_file_problem(key, key.stat().st_mode, "the client certificate's key")
    except OSError:
        shared = None  # (named below, when the certificate is loaded with it)
    if shared is not None:
        raise ConfigError(f"SHOAL_TLS_KEY: {shared}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = True
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"SHOAL_TLS_CA: {ca}: not a readable PEM CA certificate ({exc})") from exc
    crl = _crl_of(env, ca)
    if crl is not None:
        try:
            context.load_verify_locations(cafile=crl)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{TLS_CRL_ENV}: {crl}: not a readable PEM CRL ({exc})") from exc
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"SHOAL_TLS_CERT, SHOAL_TLS_KEY: {cert}, {key}: cannot load the certificate with "
            f"its key ({exc})"
        ) from exc
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_scheme(url: str, context: ssl.SSLContext | None) -> str:
    """`url` with `https://` for `http://` when a client certificate is presented."""
    if context is not None and url.startswith("http://"):
        return "https://" + url.removeprefix("http://")
    return url


def server_name(address: str, known: Mapping[str, str] | None = None) -> str:
    """The name a server at `address` (HOST:PORT or a URL) must hold in its certificate: the
    node id `known` gives for that HOST:PORT (a node certificate names its id as a DNS SAN),
    else the host itself (a DNS name or an IP address SAN, `shoal ca issue --san`)."""
    hostport = address.split("://", 1)[-1].split("/", 1)[0]
    if known and hostport in known:
        return known[hostport]
    host = hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 or "]" in hostport else hostport
    return host.strip("[]")
