"""The dashboard's routes: the page, its assets, the login page and the event stream.

Everything here is a GET but the login, which only answers a cookie: the dashboard never
starts, stops or changes anything on the node.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from node.openapi import RouteDoc
from node.security import bad_request
from node.ui.access import (
    ASSETS_PREFIX,
    COOKIE_NAME,
    EVENTS_PATH,
    FAVICON_PATH,
    LOGIN_PATH,
    SESSION_S,
    UI_PREFIX,
    UiAccess,
    certificate_reader,
)
from node.ui.events import EventHub

ASSET_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
}
FAVICON = "favicon.ico"
FAVICON_CACHE = "public, max-age=86400"
"""A browser asks for the icon again at most once a day."""
HTML = "text/html"
FORM = "application/x-www-form-urlencoded"
MAX_TOKEN_CHARS = 4096

MESSAGES = {
    "": "",
    "wrong": "Wrong token: it does not match this node's ui_token_file.",
    "off": "The dashboard is off on this node: it has no ui_token_file. Set one (chmod 600) "
    "in the node's settings and restart it.",
}
"""The login page's only messages: nothing a request sends is ever written into a page."""


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str


def load_assets() -> dict[str, Asset]:
    """The files of node/ui/static by name, read once."""
    folder = resources.files("node.ui") / "static"
    assets = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in ASSET_TYPES:
            assets[entry.name] = Asset(entry.read_bytes(), ASSET_TYPES[suffix])
    return assets


def _page(name: str) -> str:
    return (resources.files("node.ui") / "static" / name).read_text(encoding="utf-8")


class DashboardRoutes:
    """The handlers of the dashboard, over one EventHub and one UiAccess."""

    def __init__(self, access: UiAccess, hub: EventHub) -> None:
        self.access = access
        self.hub = hub
        self._assets = load_assets()
        self._index = _page("index.html").encode()
        self._login = _page("login.html")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(UI_PREFIX, self._handle_index),
            web.get(LOGIN_PATH, self._handle_login_page),
            web.post(LOGIN_PATH, self._handle_login),
            web.get(ASSETS_PREFIX + "{name}", self._handle_asset),
            web.get(EVENTS_PATH, self.hub.handle_events),
            web.get(FAVICON_PATH, self._handle_favicon),
        ]

    # public: holds nothing secret; no body is read (one announced is refused, 413), no query
    # is looked at, the answer is a constant from memory (778 bytes): nothing waits or grows
    async def _handle_favicon(self, request: web.Request) -> web.Response:
        if request.content_length or request.headers.get("Transfer-Encoding"):
            raise web.HTTPRequestEntityTooLarge(
                max_size=0,
                actual_size=request.content_length or 0,
                text="GET /favicon.ico takes no body",
            )
        icon = self._assets[FAVICON]
        return web.Response(
            body=icon.body, content_type=icon.content_type, headers={"Cache-Control": FAVICON_CACHE}
        )

    async def _handle_index(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._index, content_type=HTML, headers={"Cache-Control": "no-store"}
        )

    async def _handle_asset(self, request: web.Request) -> web.Response:
        asset = self._assets.get(request.match_info["name"])
        if asset is None:
            raise web.HTTPNotFound(reason=f"no dashboard asset {request.match_info['name']!r}")
        return web.Response(
            body=asset.body, content_type=asset.content_type, headers={"Cache-Control": "no-cache"}
        )

    def _login_page(self, message: str, status: int = 200) -> web.Response:
        text = self._login.replace("{{message}}", html.escape(MESSAGES[message]))
        return web.Response(
            text=text, content_type=HTML, status=status, headers={"Cache-Control": "no-store"}
        )

    async def _handle_login_page(self, request: web.Request) -> web.Response:
        if self.access.open or certificate_reader(request):
            raise web.HTTPSeeOther(UI_PREFIX)
        return self._login_page("" if self.access.token is not None else "off")

    async def _handle_login(self, request: web.Request) -> web.Response:
        """Exchange the read token (form field `token`) for the session cookie."""
        if request.content_type != FORM:
            raise bad_request(f"the login takes a form ({FORM}) with the field token")
        form = await request.post()
        given = form.get("token")
        if not isinstance(given, str) or not given or len(given) > MAX_TOKEN_CHARS:
            raise bad_request(
                f"form field token: the node's read token (1 to {MAX_TOKEN_CHARS} characters)",
                param="token",
            )
        if self.access.open:
            raise web.HTTPSeeOther(UI_PREFIX)
        if self.access.token is None:
            return self._login_page("off", 401)
        if not self.access.token_matches(given):
            return self._login_page("wrong", 401)
        response = web.HTTPSeeOther(UI_PREFIX)
        response.set_cookie(
            COOKIE_NAME,
            self.access.session_cookie(time.time()),
            max_age=int(SESSION_S),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        raise response


PAGE: dict[str, Any] = {"type": "string"}
PAGE_DOCS = (
    RouteDoc(
        "GET",
        UI_PREFIX,
        "The web dashboard (HTML; its data comes from /v1/events); redirects to the login "
        "page without a session or a reader or operator client certificate (TLS)",
        ((200, "the page"), (303, "log in first"), (403, "a node's certificate")),
        authenticated=False,
        response=PAGE,
        response_type=HTML,
    ),
    RouteDoc(
        "GET",
        LOGIN_PATH,
        "The dashboard's login page (asks for the read token of ui_token_file)",
        ((200, "the page"), (303, "no login needed: on this node, or with this certificate")),
        authenticated=False,
        response=PAGE,
        response_type=HTML,
    ),
    RouteDoc(
        "POST",
        LOGIN_PATH,
        "Exchange the read token (form field `token`) for an HttpOnly, SameSite=Strict "
        "session cookie",
        (
            (303, "logged in: go to the dashboard"),
            (400, "not a form, or no token in it"),
            (401, "wrong token or no ui_token_file"),
        ),
        authenticated=False,
        body={"type": "string"},
        body_types=(FORM,),
    ),
    RouteDoc(
        "GET",
        FAVICON_PATH,
        "The dashboard's icon (a 32x32 ICO), which browsers ask for on every origin they open",
        ((200, "the icon"), (413, "a body was sent")),
        authenticated=False,
        response=PAGE,
        response_type="image/x-icon",
    ),
    RouteDoc(
        "GET",
        ASSETS_PREFIX + "{name}",
        "A static file of the dashboard (script, style sheet, icon), shipped in the package",
        ((200, "the file"), (404, "no such file")),
        authenticated=False,
        parameters=(("name", "path", "The file's name"),),
        response=PAGE,
        response_type="text/plain",
    ),
)
"""The OpenAPI entries of the page, the login and the assets (none holds data)."""


def dashboard_docs(topics: tuple[str, ...]) -> list[RouteDoc]:
    """The OpenAPI entries of the dashboard's routes, the event stream's with its `topics`."""
    events = RouteDoc(
        "GET",
        EVENTS_PATH,
        "The dashboard's live updates as Server-Sent Events: each topic's snapshot when it "
        "changes (at most once a second), `log:JOB_ID` a job's new stdout and stderr; needs "
        "the dashboard's session cookie, a reader or operator client certificate (TLS), or a "
        "signature",
        (
            (200, "text/event-stream"),
            (400, "unknown topic"),
            (401, "no session cookie, certificate or signature"),
            (403, "a node's certificate (the dashboard is for readers and operators)"),
            (404, "no such job"),
        ),
        parameters=(
            (
                "topics",
                "query",
                f"Comma-separated: {', '.join(topics)}, log:JOB_ID",
                {"type": "string", "x-required": True},
            ),
        ),
        response=PAGE,
        response_type="text/event-stream",
    )
    return [*PAGE_DOCS, events]
