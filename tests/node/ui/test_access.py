"""The dashboard's protection against a live daemon: the token file's mode, the login, the
session cookie, 401 without it, the security headers, and that the UI only reads."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import ClientSession, ClientTimeout

from config import ConfigError, signing_middleware
from node import NodeDaemon
from node.ui import COOKIE_NAME, UiAccess, load_ui_token
from node.ui.access import SESSION_S
from tests.node.daemons import test_settings

SECRET = b"cluster-secret-of-the-ui-tests-0123"
TOKEN = "read-token-of-the-ui-tests-abcdef"


def _secret_files(tmp_path: Path, token_mode: int = 0o600) -> tuple[Path, Path]:
    secret, token = tmp_path / "secret", tmp_path / "ui-token"
    secret.write_bytes(SECRET)
    token.write_text(TOKEN + "\n")
    secret.chmod(0o600)
    token.chmod(token_mode)
    return secret, token


@asynccontextmanager
async def _node(tmp_path: Path, **flags: object) -> AsyncIterator[str]:
    async with NodeDaemon(test_settings(tmp_path, "ui", **flags)) as daemon:
        yield f"http://127.0.0.1:{daemon.port}"


@pytest.mark.parametrize("mode", [0o640, 0o604])
async def test_a_token_file_readable_by_group_or_others_stops_the_node_naming_it(
    tmp_path: Path, mode: int
) -> None:
    secret, token = _secret_files(tmp_path, mode)
    with pytest.raises(ConfigError, match=re.escape(f"{token}: ui token file is readable")):
        async with _node(tmp_path, secret_file=secret, ui_token_file=token):
            pass


def test_a_session_is_the_tokens_own_and_expires() -> None:
    access = UiAccess(TOKEN.encode(), api_open=False)
    name = "shoal_ui_8770"
    cookie = access.session_cookie(1000.0, name)
    assert TOKEN not in cookie
    assert access.session_valid(cookie, 1000.0 + SESSION_S - 1, name)
    assert not access.session_valid(cookie, 1000.0 + SESSION_S + 1, name)  # expired
    expires, mac = cookie.split(".")
    assert not access.session_valid(f"{int(expires) + 3600}.{mac}", 1000.0, name)  # by hand
    other = UiAccess(b"another-token-entirely-0123456", api_open=False)
    assert not other.session_valid(cookie, 1000.0, name)  # a new token ends every session
    assert not access.session_valid(cookie, 1000.0, "shoal_ui_8771")  # another port's
    assert not access.session_valid(None, 1000.0, name)
    assert not access.session_valid("garbage", 1000.0, name)
    assert not UiAccess(None, api_open=True).token_matches("")


async def _login(session: ClientSession, base: str, token: str) -> tuple[int, str, str]:
    async with session.post(
        f"{base}/ui/login", data={"token": token}, allow_redirects=False
    ) as answer:
        return answer.status, answer.headers.get("Set-Cookie", ""), await answer.text()


async def test_login_cookie_and_401_without_it(tmp_path: Path) -> None:
    secret, token = _secret_files(tmp_path)
    assert load_ui_token(token) == TOKEN.encode()
    events = "/v1/events?topics=status,members"
    async with _node(tmp_path, secret_file=secret, ui_token_file=token) as base:
        async with ClientSession(timeout=ClientTimeout(total=10)) as session:
            async with session.get(f"{base}{events}") as answer:
                assert answer.status == 401
                assert "/ui/login" in (await answer.json())["reason"]
            async with session.get(f"{base}/ui/", allow_redirects=False) as answer:
                assert answer.status == 303
                assert answer.headers["Location"] == "/ui/login"
            async with session.get(f"{base}/ui/login") as answer:
                page = await answer.text()
                assert answer.status == 200
                assert 'name="token"' in page
                assert "{{" not in page
            status, cookie, page = await _login(session, base, "wrong-" + TOKEN)
            assert status == 401
            assert cookie == ""
            assert "Wrong token" in page
            assert TOKEN not in page
            status, cookie, page = await _login(session, base, TOKEN)
            assert status == 303
            assert TOKEN not in page
            assert cookie.startswith(f"{COOKIE_NAME}_{base.rsplit(':', 1)[1]}=")
            attributes = {part.strip().lower() for part in cookie.split(";")}
            assert {"httponly", "samesite=strict", "path=/"} <= attributes
            value = cookie.split(";")[0]
            headers = {"Cookie": value}
            async with session.get(f"{base}/ui/", headers=headers) as answer:
                assert answer.status == 200
                assert TOKEN not in await answer.text()
            async with session.get(f"{base}{events}", headers=headers) as answer:
                assert answer.status == 200
                assert answer.headers["Content-Type"] == "text/event-stream"
                first = await answer.content.readuntil(b"event: status\n")
                assert b"event: hello" in first
            # the cookie reads the dashboard only: no other route, and never a write
            async with session.get(f"{base}/v1/status", headers=headers) as answer:
                assert answer.status == 401
            async with session.post(f"{base}/v1/jobs", headers=headers, json={}) as answer:
                assert answer.status == 401
        signer = signing_middleware(SECRET, "cli-tester")
        timeout = ClientTimeout(total=10)
        async with (
            ClientSession(middlewares=(signer,), timeout=timeout) as signed,
            signed.get(f"{base}{events}") as answer,
        ):
            assert answer.status == 200  # a signed client reads the stream too


async def test_security_headers_on_every_dashboard_answer(tmp_path: Path) -> None:
    async with _node(tmp_path) as base, ClientSession(timeout=ClientTimeout(total=10)) as session:
        for path in ("/ui/", "/ui/assets/app.js", "/ui/assets/style.css", "/v1/events?topics=rl"):
            async with session.get(f"{base}{path}") as answer:
                assert answer.status == 200, path
                csp = answer.headers["Content-Security-Policy"]
                assert "script-src 'self'" in csp, path
                assert "unsafe-inline" not in csp, path
                assert "frame-ancestors 'none'" in csp, path
                assert answer.headers["X-Frame-Options"] == "DENY", path
                assert answer.headers["X-Content-Type-Options"] == "nosniff", path
        async with session.get(f"{base}/ui/assets/..%2Fcomponent.py") as answer:
            assert answer.status == 404
        async with session.get(f"{base}/ui/login", allow_redirects=False) as answer:
            assert answer.status == 303  # no secret and no token: nothing to log in to
        status, _, _ = await _login(session, base, "anything")
        assert status == 303
        for body in ({"json": {"token": "x"}}, {"data": {"other": "x"}}, {"data": {"token": ""}}):
            async with session.post(f"{base}/ui/login", allow_redirects=False, **body) as answer:
                assert answer.status == 400, body  # a login is a form with a token
        async with session.get(f"{base}/v1/openapi.json") as answer:
            paths = (await answer.json())["paths"]
        assert "text/event-stream" in str(paths["/v1/events"]["get"]["responses"]["200"])
        assert {"/ui/", "/ui/login", "/ui/assets/{name}"} <= set(paths)


async def test_with_a_secret_and_no_token_the_dashboard_is_off(tmp_path: Path) -> None:
    secret, _ = _secret_files(tmp_path)
    async with (
        _node(tmp_path, secret_file=secret) as base,
        ClientSession(timeout=ClientTimeout(total=10)) as session,
    ):
        status, cookie, page = await _login(session, base, "anything-at-all-0123")
        assert status == 401
        assert cookie == ""
        assert "has no ui_token_file" in page
        async with session.get(f"{base}/v1/events?topics=status") as answer:
            assert answer.status == 401


def test_the_pages_hold_no_inline_script_or_handler() -> None:
    static = Path(__file__).resolve().parents[3] / "node" / "ui" / "static"
    for page in static.glob("*.html"):
        text = page.read_text()
        assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text) is None, page
        assert re.search(r"\son[a-z]+=", text) is None, page
        assert "style=" not in text, page
    script = (static / "app.js").read_text()
    assert "innerHTML" not in script
    assert "eval(" not in script
