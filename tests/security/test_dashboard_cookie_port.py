"""Finding 10: browsers send a host's cookies to every port of it, so the dashboard's session
cookie is named for the port the browser called (`shoal_ui_PORT`) and its value is bound to
that name: two dashboards on one host (two tunnels) keep their own sessions, and a session of
one port opens no other."""

from __future__ import annotations

from pathlib import Path

from aiohttp import ClientSession, ClientTimeout

from node.ui import COOKIE_NAME
from tests.node.ui.test_access import TOKEN, _node, _secret_files


async def _login(session: ClientSession, base: str, host: str) -> tuple[str, str]:
    async with session.post(
        f"{base}/ui/login",
        data={"token": TOKEN},
        headers={"Host": host},
        allow_redirects=False,
    ) as answer:
        assert answer.status == 303
        morsel = next(iter(answer.cookies.values()))
        return morsel.key, morsel.value


async def _page(session: ClientSession, base: str, host: str, cookie: str) -> int:
    headers = {"Host": host, "Cookie": cookie}
    async with session.get(f"{base}/ui/", headers=headers, allow_redirects=False) as answer:
        return answer.status


async def test_dashboard_cookie_port_names_and_binds_the_session(tmp_path: Path) -> None:
    secret, token = _secret_files(tmp_path)
    timeout = ClientTimeout(total=10)
    async with (
        _node(tmp_path, secret_file=secret, ui_token_file=token) as base,
        ClientSession(timeout=timeout) as session,
    ):
        session.cookie_jar.clear()
        port = int(base.rsplit(":", 1)[1])
        here, tunnel = f"127.0.0.1:{port}", "127.0.0.1:18771"  # the node, and a local tunnel
        name, value = await _login(session, base, here)
        assert name == f"{COOKIE_NAME}_{port}"
        other_name, other_value = await _login(session, base, tunnel)
        assert other_name == f"{COOKIE_NAME}_18771"
        both = f"{name}={value}; {other_name}={other_value}"  # what the browser sends both
        assert await _page(session, base, here, both) == 200
        assert await _page(session, base, tunnel, both) == 200
        # a session of one port opens no other, under either name
        assert await _page(session, base, tunnel, f"{name}={value}") == 303
        assert await _page(session, base, tunnel, f"{other_name}={value}") == 303
        assert await _page(session, base, here, f"{COOKIE_NAME}={value}") == 303
