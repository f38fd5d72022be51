"""Finding 3: POST /ui/login, the one POST served without a credential, read up to 64 MiB
(gzip-decompressed), as many at once as were sent. Now its body is a plain form of at most
LOGIN_MAX_BYTES: an announced larger one is refused before a byte is read (413), a chunked one
at that size, an encoded one at once (415), at most MAX_LOGINS are read at once (503), and a
login's body must arrive within LOGIN_READ_S (408)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import ClientSession, ClientTimeout, web

import node.ui.routes
from node.daemon import NodeDaemon
from node.limits import LOGIN_MAX_BYTES, MAX_LOGINS
from tests.node.daemons import test_settings
from tests.node.ui.test_access import TOKEN, _secret_files
from tests.security.attackers import login_post


@asynccontextmanager
async def _daemon(tmp_path: Path) -> AsyncIterator[int]:
    secret, token = _secret_files(tmp_path)
    settings = test_settings(tmp_path, "n1", secret_file=secret, ui_token_file=token)
    async with NodeDaemon(settings) as daemon:
        yield daemon.port


async def test_login_bodies_are_small_plain_and_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    original = web.Request.read

    async def counting_read(self: web.Request) -> bytes:
        nonlocal reads
        reads += 1
        return await original(self)

    monkeypatch.setattr(web.Request, "read", counting_read)
    async with _daemon(tmp_path) as port:
        answers = await asyncio.gather(
            login_post(port, early_s=5.0),  # 60 MiB with a Content-Length
            login_post(port, size=8 * 1024 * 1024, chunked=True, early_s=5.0),
            login_post(port, gzipped=True, early_s=5.0),  # about 250 KiB, 60 MiB inflated
        )
        assert answers[0].startswith(b"HTTP/1.1 413"), answers[0]
        assert answers[1].startswith(b"HTTP/1.1 413"), answers[1]
        assert answers[2].startswith(b"HTTP/1.1 415"), answers[2]
        small = await login_post(port, size=LOGIN_MAX_BYTES, early_s=5.0)
        assert small.startswith(b"HTTP/1.1 400"), small  # read: a token over MAX_TOKEN_CHARS
        async with (
            ClientSession(timeout=ClientTimeout(total=10)) as session,
            session.post(
                f"http://127.0.0.1:{port}/ui/login",
                data={"token": TOKEN},
                allow_redirects=False,
            ) as answer,
        ):
            assert answer.status == 303
    assert reads == 0, "no login body is read whole (request.read/post)"


async def test_login_bodies_are_read_a_few_at_once_and_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.ui.routes, "LOGIN_READ_S", 1.0)
    async with _daemon(tmp_path) as port:
        slow = []
        for _ in range(MAX_LOGINS):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /ui/login HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n\r\ntok"
            )
            await writer.drain()
            slow.append((reader, writer))
        await asyncio.sleep(0.3)
        busy = await login_post(port, size=64, early_s=5.0)
        assert busy.startswith(b"HTTP/1.1 503"), busy
        for reader, writer in slow:
            status = await asyncio.wait_for(reader.readline(), 10.0)
            assert status.startswith(b"HTTP/1.1 408"), status
            writer.close()
        again = await login_post(port, size=64, early_s=5.0)
        assert again.startswith(b"HTTP/1.1 401"), again
