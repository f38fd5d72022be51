"""Who may read the dashboard: the read token, its session cookie, the gate and the headers.

The token (`ui_token_file`, chmod 600) is posted once to the login page and answered with an
HttpOnly, SameSite=Strict cookie holding an expiry and its HMAC under the token, so a session
needs no server state and ends when the token changes. The gate lets GETs of the dashboard
through with that cookie, or with a verified `reader` or `operator` client certificate (TLS
identities); a `node` certificate is refused (403). Without either the pages redirect to the
login page and the event stream answers 401. The token is never written into a page.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from config import HEADER_SIGNATURE, read_secret_file
from config.tls import CertRole
from node.security import BROWSER_READER, PEER_IDENTITY, json_error

UI_PREFIX = "/ui/"
LOGIN_PATH = "/ui/login"
EVENTS_PATH = "/v1/events"
ASSETS_PREFIX = "/ui/assets/"
COOKIE_NAME = "shoal_ui"
"""The session cookie's name before its port: `shoal_ui_PORT`, `__Host-shoal_ui_PORT` over
HTTPS (cookie_name)."""
SESSION_S = 12 * 3600.0
"""How long one login lasts."""
READER_ROLES = frozenset({CertRole.READER, CertRole.OPERATOR})
"""The certificate roles that may read the dashboard without the token's cookie."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}
"""Sent with every answer under /ui/ and with the event stream."""


def add_security_headers(response: web.StreamResponse) -> None:
    """Set SECURITY_HEADERS on `response` (before it is prepared)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value


def load_ui_token(path: Path | None) -> bytes | None:
    """The dashboard's read token from `path` (None: no file configured). Raises ConfigError,
    naming the file, when it is missing, too short, or readable by group or others."""
    if path is None:
        return None
    return read_secret_file(path, "ui token file")


@dataclass(frozen=True)
class UiAccess:
    """The dashboard's credential: `token` (None: no ui_token_file) and whether the node's API
    is open anyway (no cluster secret: loopback dev mode)."""

    token: bytes | None
    api_open: bool

    @property
    def open(self) -> bool:
        """No login needed: no token configured on a node whose API needs no signature."""
        return self.token is None and self.api_open

    def token_matches(self, given: str) -> bool:
        """Whether `given` is the read token (constant time)."""
        if self.token is None:
            return False
        return hmac.compare_digest(given.strip().encode(), self.token)

    def session_cookie(self, now: float, name: str) -> str:
        """A session value for the cookie `name` (cookie_name), valid until now + SESSION_S."""
        assert self.token is not None
        expires = str(int(now + SESSION_S))
        return f"{expires}.{_mac(self.token, name, expires)}"

    def session_valid(self, value: str | None, now: float, name: str) -> bool:
        """Whether `value` is a session this token made for the cookie `name` that has not
        expired (a value made for another port's cookie is not)."""
        if self.token is None or not value or "." not in value:
            return False
        expires, mac = value.split(".", 1)
        if not expires.isdigit() or int(expires) < now:
            return False
        return hmac.compare_digest(mac, _mac(self.token, name, expires))


def _mac(token: bytes, name: str, expires: str) -> str:
    message = f"shoal-ui-session:{name}:{expires}".encode()
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def cookie_name(request: web.Request) -> str:
    """The session cookie's name for the port the browser called (its Host header's, which a
    tunnel's local port is): `shoal_ui_PORT`, with the `__Host-` prefix over HTTPS (then the
    browser keeps it only as sent: Secure, Path=/, no Domain). Browsers send a host's cookies
    to every port of it; the name keeps each port's session apart, and its MAC covers the
    name, so a session of one port opens no other."""
    port = request.url.port or (443 if request.secure else 80)
    prefix = "__Host-" if request.secure else ""
    return f"{prefix}{COOKIE_NAME}_{port}"


def _public(request: web.Request) -> bool:
    """The login page and the static assets: they hold no data."""
    return request.path == LOGIN_PATH or request.path.startswith(ASSETS_PREFIX)


def _ui_path(path: str) -> bool:
    return path == "/ui" or path.startswith(UI_PREFIX) or path == EVENTS_PATH


def certificate_reader(request: web.Request) -> bool:
    """Whether `request` came with a verified client certificate that may read the dashboard
    (a role in READER_ROLES)."""
    identity = request.get(PEER_IDENTITY)
    return identity is not None and identity.role in READER_ROLES


def _role_refusal(role: CertRole) -> web.Response:
    return json_error(
        403,
        f"role {role.value} may not read the dashboard: present a reader or operator"
        f" certificate (`shoal ca issue NAME --role reader`), or log in with the read token at"
        f" {LOGIN_PATH}",
        code="forbidden",
        role=role.value,
    )


def ui_gate(access: UiAccess) -> Middleware:
    """The middleware in front of the signature check that admits dashboard readers: a GET
    with the session cookie (or on a node with no login), or with a verified client
    certificate (set by node.identity before this gate) of a role in READER_ROLES; a `node`
    certificate gets 403 on the data, with or without a cookie (a node never reads the
    dashboard)."""

    @web.middleware
    async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not _ui_path(request.path):
            return await handler(request)
        if request.method == "POST" and request.path == LOGIN_PATH:
            request[BROWSER_READER] = True
            return _secured(await handler(request))
        if request.method not in ("GET", "HEAD"):
            return await handler(request)  # the signature check answers (the UI writes nothing)
        if _public(request):
            request[BROWSER_READER] = True
            return _secured(await handler(request))
        identity = request.get(PEER_IDENTITY)
        if identity is not None:
            if identity.role not in READER_ROLES:
                return _secured(_role_refusal(identity.role))
            request[BROWSER_READER] = True
            return _secured(await handler(request))
        name = cookie_name(request)
        if access.open or access.session_valid(request.cookies.get(name), time.time(), name):
            request[BROWSER_READER] = True
            return _secured(await handler(request))
        if request.path == EVENTS_PATH:
            if HEADER_SIGNATURE in request.headers and not access.api_open:
                return await handler(request)  # a signed client reads the stream too
            response = json_error(
                401, f"log in to the dashboard at {LOGIN_PATH} (its cookie is missing or expired)"
            )
            return _secured(response)
        raise _secured_exception(web.HTTPSeeOther(LOGIN_PATH))

    return gate


def _secured(response: web.StreamResponse) -> web.StreamResponse:
    if not response.prepared:
        add_security_headers(response)
    return response


def _secured_exception(exc: web.HTTPException) -> web.HTTPException:
    add_security_headers(exc)
    return exc
