"""The dashboard over TLS identities: a verified `reader` or `operator` certificate opens /ui/
and its event stream without the token's cookie, a `node` certificate is refused, and a caller
without a certificate goes through the token and cookie as before."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.daemon import NodeDaemon
from node.ui import COOKIE_NAME
from tests.node.daemons import test_settings
from tests.node.tls_pki import Pki, make_pki

SECRET = b"ui-tls-test-cluster-secret-0123456789"
TOKEN = "read-token-of-the-ui-tls-tests-abcdef"
EVENTS = "/v1/events?topics=status"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _files(tmp_path: Path) -> tuple[Path, Path]:
    secret, token = tmp_path / "secret", tmp_path / "ui-token"
    secret.write_bytes(SECRET)
    token.write_text(TOKEN + "\n")
    secret.chmod(0o600)
    token.chmod(0o600)
    return secret, token


async def _get(
    port: int, context: ssl.SSLContext, path: str, cookies: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """Status, headers and text of GET `path` (no redirect followed)."""
    async with (
        aiohttp.ClientSession(cookies=cookies, timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(
            f"https://127.0.0.1:{port}{path}",
            ssl=context,
            server_hostname="a",
            allow_redirects=False,
        ) as answer,
    ):
        return answer.status, dict(answer.headers), await answer.text()


async def _first_event(port: int, context: ssl.SSLContext) -> tuple[str, Any]:
    """The first topic event (after the stream's hello) of GET /v1/events with `context`."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(
            f"https://127.0.0.1:{port}{EVENTS}", ssl=context, server_hostname="a"
        ) as answer,
    ):
        assert answer.status == 200, await answer.text()
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        name = ""
        async for raw in answer.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: ") and name != "hello":
                return name, json.loads(line.removeprefix("data: "))
    raise AssertionError("the event stream ended before its first topic event")


async def test_reader_and_operator_certificates_read_the_dashboard_a_node_certificate_does_not(
    tmp_path: Path, pki: Pki
) -> None:
    secret, token = _files(tmp_path)
    settings = test_settings(
        tmp_path,
        "a",
        tls=pki.node_tls("a"),
        auth="hmac+tls",
        secret_file=secret,
        ui_token_file=token,
    )
    async with NodeDaemon(settings) as daemon:
        port = daemon.port
        for name in ("rita", "alice"):  # reader, operator
            status, headers, text = await _get(port, pki.client(name), "/ui/")
            assert status == 200, (name, text)
            assert "<html" in text.lower()
            assert "Content-Security-Policy" in headers
            assert TOKEN not in text
            status, headers, _ = await _get(port, pki.client(name), "/ui/login")
            assert status == 303  # no token to ask for
            assert headers["Location"] == "/ui/"
            event, data = await _first_event(port, pki.client(name))
            assert event == "status"
            assert data["node_id"] == "a"
        # a node's certificate: refused on the page and the stream, with the reason
        for path in ("/ui/", EVENTS):
            status, _, text = await _get(port, pki.client("b"), path)
            assert status == 403, (path, text)
            body = json.loads(text)
            assert body["error"] == "forbidden"
            assert body["role"] == "node"
            assert "reader" in body["reason"]
        # no certificate, no cookie: the login page and 401, as without TLS
        anonymous = pki.client(None)
        status, headers, _ = await _get(port, anonymous, "/ui/")
        assert status == 303
        assert headers["Location"] == "/ui/login"
        status, _, text = await _get(port, anonymous, EVENTS)
        assert status == 401, text
        assert "/ui/login" in json.loads(text)["reason"]
        status, _, text = await _get(port, anonymous, "/ui/login")
        assert status == 200
        assert "token" in text
        # the token's cookie still works without a certificate
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.post(
                f"https://127.0.0.1:{port}/ui/login",
                data={"token": TOKEN},
                ssl=anonymous,
                server_hostname="a",
                allow_redirects=False,
            ) as answer,
        ):
            assert answer.status == 303
            name = f"__Host-{COOKIE_NAME}_{port}"
            cookie = answer.cookies[name].value
        status, _, text = await _get(port, anonymous, "/ui/", {name: cookie})
        assert status == 200, text
        # the reader only reads: the login is no way to write, and other writes need an operator
        status, _, text = await _get(port, pki.client("rita"), "/v1/status")
        assert status == 200, text


async def test_with_tls_only_and_no_token_a_node_certificate_is_still_refused(
    tmp_path: Path, pki: Pki
) -> None:
    """`auth: tls` without a cluster secret or ui_token_file: the dashboard needs no login, but
    only for readers and operators: a node's certificate does not read it."""
    async with NodeDaemon(test_settings(tmp_path, "a", tls=pki.node_tls("a"))) as daemon:
        status, _, text = await _get(daemon.port, pki.client("rita"), "/ui/")
        assert status == 200, text
        status, _, text = await _get(daemon.port, pki.client("b"), "/ui/")
        assert status == 403, text
        status, _, text = await _get(daemon.port, pki.client("b"), EVENTS)
        assert status == 403, text
        status, _, text = await _get(daemon.port, pki.client(None), "/ui/")
        assert status == 401, text  # auth tls: a certificate for every route but the public ones
        assert json.loads(text)["error"] == "certificate_required"
