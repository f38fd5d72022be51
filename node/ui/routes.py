"""The dashboard's routes: the page, its assets, the login page and the event stream.

Everything here is a GET but the login, which only answers a cookie: the dashboard never
starts, stops or changes anything on the node.
"""

from __future__ import annotations

import asyncio
import html
import time
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web

from config.declare import Caller, Param, Refusal, route
from node.limits import (
    LOGIN_MAX_BYTES,
    LOGIN_READ_S,
    MAX_LOGINS,
    BodyRefused,
    read_small_body,
    refused_answer,
)
from node.security import bad_request
from node.ui.access import (
    ASSETS_PREFIX,
    EVENTS_PATH,
    LOGIN_PATH,
    SESSION_S,
    UI_PREFIX,
    UiAccess,
    certificate_reader,
    cookie_name,
)
from node.ui.events import EventHub

PAGE: dict[str, Any] = {"type": "string"}
BROWSERS = (Caller.READER, Caller.OPERATOR)
"""Who reads the dashboard: a reader (its session, a reader certificate) or an operator."""
NODE_REFUSED = Refusal(403, "forbidden", "a node's certificate (the dashboard is for readers)")
ASSET_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
HTML = "text/html"
FORM = "application/x-www-form-urlencoded"
MAX_TOKEN_CHARS = 1024

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
        self._logins = asyncio.Semaphore(MAX_LOGINS)

    @route(
        "GET",
        UI_PREFIX,
        callers=BROWSERS,
        session=True,
        answers=((200, "the page"), (303, "log in first")),
        errors=[NODE_REFUSED],
        answer=PAGE,
        answer_type=HTML,
    )
    async def _handle_index(self, request: web.Request) -> web.Response:
        """The web dashboard (HTML; its data comes from /v1/events); redirects to the login page
        without a session or a reader or operator client certificate (TLS)"""
        return web.Response(
            body=self._index, content_type=HTML, headers={"Cache-Control": "no-store"}
        )

    @route(
        "GET",
        ASSETS_PREFIX + "{name}",
        callers=[Caller.PUBLIC],
        answers=((200, "the file"),),
        errors=[Refusal(404, "not_found", "no such file")],
        params=(("name", "path", "The file's name"),),
        answer=PAGE,
        answer_type="text/plain",
    )
    async def _handle_asset(self, request: web.Request) -> web.Response:
        """A static file of the dashboard (script, style sheet), shipped in the package"""
        asset = self._assets.get(request.match_info["name"])
        if asset is None:
            raise web.HTTPNotFound(reason=f"no dashboard asset {request.match_info['name']!r}")
        return web.Response(
            body=asset.body, content_type=asset.content_type, headers={"Cache-Control": "no-cache"}
        )

    @route(
        "GET",
        EVENTS_PATH,
        callers=BROWSERS,
        session=True,
        answers=((200, "text/event-stream"),),
        errors=[
            Refusal(400, "bad_request", "unknown topic"),
            Refusal(401, "unauthorized", "no session cookie, certificate or signature"),
            NODE_REFUSED,
            Refusal(404, "not_found", "no such job"),
        ],
        answer=PAGE,
        answer_type="text/event-stream",
        each=lambda routes, found: [replace(found, params=(routes.topics_parameter(),))],
    )
    async def _handle_events(self, request: web.Request) -> web.StreamResponse:
        """The dashboard's live updates as Server-Sent Events: each topic's snapshot when it
        changes (at most once a second), `log:JOB_ID` a job's new stdout and stderr; needs the
        dashboard's session cookie, a reader or operator client certificate (TLS), or a
        signature"""
        return await self.hub.handle_events(request)

    def topics_parameter(self) -> Param:
        """The `topics` query parameter, naming the hub's topics."""
        topics = ", ".join(self.hub.topics)
        description = f"Comma-separated: {topics}, log:JOB_ID"
        return ("topics", "query", description, {"type": "string", "x-required": True})

    def _login_page(self, message: str, status: int = 200) -> web.Response:
        text = self._login.replace("{{message}}", html.escape(MESSAGES[message]))
        return web.Response(
            text=text, content_type=HTML, status=status, headers={"Cache-Control": "no-store"}
        )

    @route(
        "GET",
        LOGIN_PATH,
        callers=[Caller.PUBLIC],
        answers=(
            (200, "the page"),
            (303, "no login needed: on this node, or with this certificate"),
        ),
        answer=PAGE,
        answer_type=HTML,
    )
    async def _handle_login_page(self, request: web.Request) -> web.Response:
        """The dashboard's login page (asks for the read token of ui_token_file)"""
        if self.access.open or certificate_reader(request):
            raise web.HTTPSeeOther(UI_PREFIX)
        return self._login_page("" if self.access.token is not None else "off")

    @route(
        "POST",
        LOGIN_PATH,
        callers=[Caller.PUBLIC],
        answers=((303, "logged in: go to the dashboard"),),
        errors=[
            Refusal(400, "bad_request", "not a form, or no token in it"),
            Refusal(401, "unauthorized", "wrong token or no ui_token_file"),
            Refusal(408, "body_timeout", "the body did not arrive within LOGIN_READ_S"),
            Refusal(413, "too_large", "a body over LOGIN_MAX_BYTES"),
            Refusal(415, "unsupported_encoding", "a Content-Encoding"),
            Refusal(503, "busy", "MAX_LOGINS logins are being read: retry"),
        ],
        body=PAGE,
        body_types=(FORM,),
    )
    async def _handle_login(self, request: web.Request) -> web.StreamResponse:
        """Exchange the read token (form field `token`) for an HttpOnly, SameSite=Strict session
        cookie named for the port (a plain form of at most 4 KiB, no Content-Encoding)"""
        if request.content_type != FORM:
            raise bad_request(f"the login takes a form ({FORM}) with the field token")
        try:
            body = await read_small_body(request, self._logins, LOGIN_MAX_BYTES, LOGIN_READ_S)
        except BodyRefused as exc:
            return await refused_answer(request, exc)
        try:
            form = parse_qs(body.decode("ascii"), keep_blank_values=True, max_num_fields=8)
        except (UnicodeDecodeError, ValueError):
            form = {}
        given = (form.get("token") or [""])[0]
        if not given or len(given) > MAX_TOKEN_CHARS:
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
        name = cookie_name(request)
        response.set_cookie(
            name,
            self.access.session_cookie(time.time(), name),
            max_age=int(SESSION_S),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        raise response
