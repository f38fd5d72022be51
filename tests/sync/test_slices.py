"""A file route's bytes (sync.files.slices.FileSlice): the same slice over plain HTTP
(sendfile) and over TLS (chunks read ahead in a worker thread), under an upload cap too; a file
that shrinks while it is sent cuts the answer short; the descriptor is closed either way."""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sync.files import slices
from sync.files.download import RateLimiter
from sync.files.slices import FileSlice
from tests.node.tls_pki import Pki, make_pki

BLOB = bytes(range(256)) * 41 + b"tail"  # 10,500 bytes, no two chunks alike
OFFSET, COUNT = 123, 9_000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), nodes=("node-x",))


class Served:
    """One route answering a FileSlice of `path`; `sent` sums what on_sent was told and `fds`
    holds each descriptor handed to a slice."""

    def __init__(self, path: Path, count: int, limiter: RateLimiter | None) -> None:
        self.sent = 0
        self.fds: list[int] = []
        self._path = path
        self._count = count
        self._limiter = limiter

    def _on_sent(self, count: int) -> None:
        self.sent += count

    async def handle(self, request: web.Request) -> web.StreamResponse:
        fd = os.open(self._path, os.O_RDONLY)
        self.fds.append(fd)
        headers = {"Content-Type": "application/octet-stream"}
        return FileSlice(fd, OFFSET, self._count, 200, headers, self._limiter, self._on_sent)


Serve = Callable[..., Awaitable[tuple[Served, str, ssl.SSLContext | bool]]]
"""serve(tls, count=COUNT, limiter=None): a server of the slice, its URL, the client's context."""


@pytest.fixture
async def serve(tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Serve]:
    monkeypatch.setattr(slices, "TLS_CHUNK_BYTES", 1_000)
    monkeypatch.setattr(slices, "LIMITED_SEND_BYTES", 700)
    path = tmp_path / "blob.bin"
    path.write_bytes(BLOB)
    servers: list[TestServer] = []

    async def start(
        tls: bool, count: int = COUNT, limiter: RateLimiter | None = None
    ) -> tuple[Served, str, ssl.SSLContext | bool]:
        served = Served(path, count, limiter)
        app = web.Application()
        app.router.add_get("/blob", served.handle)
        server = TestServer(app, host="127.0.0.1", port=0)
        context = None
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(pki.cert("node-x"), pki.key("node-x"))
        await server.start_server(ssl=context)
        servers.append(server)
        scheme = "https" if tls else "http"
        client: ssl.SSLContext | bool = pki.client(None) if tls else True
        return served, f"{scheme}://127.0.0.1:{server.port}/blob", client

    yield start
    for server in servers:
        await server.close()


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("capped", [False, True], ids=["free", "capped"])
async def test_the_slice_arrives_whole(serve: Serve, tls: bool, capped: bool) -> None:
    limiter = RateLimiter(10 << 20) if capped else None
    served, url, client = await serve(tls, limiter=limiter)
    async with aiohttp.ClientSession() as session, session.get(url, ssl=client) as answer:
        body = await answer.read()
    assert body == BLOB[OFFSET : OFFSET + COUNT]
    assert served.sent == COUNT
    assert all(_closed(fd) for fd in served.fds)


async def test_a_file_that_shrinks_over_tls_cuts_the_answer_short(serve: Serve) -> None:
    """The slice promises more than the file holds: the reads ahead come back empty, the
    answer ends before its Content-Length, and the descriptor is still closed."""
    count = len(BLOB) - OFFSET + 2_500
    served, url, client = await serve(True, count=count)
    async with aiohttp.ClientSession() as session, session.get(url, ssl=client) as answer:
        with pytest.raises(aiohttp.ClientPayloadError):
            await answer.read()
    assert served.sent == len(BLOB) - OFFSET
    assert all(_closed(fd) for fd in served.fds)
