"""TLS terminated by worker threads (`tls.workers`, node.identity.terminator): the handshake and
the encryption happen in a worker, the daemon's loop serves the plain bytes over a socket pair
and still sees the TLS connection (the client's address, its certificate); large bodies go
both ways with flow control; a refused handshake is named; stopping closes every socket."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import io
import os
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from config import ConfigError, load_settings
from config.settings import AuthMode
from config.tls import CertRole, init_ca
from config.tls.section import default_tls_workers
from health import HealthStatus
from node.identity.listener import IdentitySite
from node.identity.terminator import TlsFacts, TlsWorkers, _Relay
from node.startup import listen_sockets
from tests.node.test_site_stop import leaks_seen
from tests.node.tls_pki import Pki, make_pki

BIG = 24 * 1024 * 1024


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class _Contexts:
    """What IdentitySite asks of node.identity's TlsContexts: the server context of now."""

    def __init__(self, pki: Pki) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(pki.cert("a"), pki.key("a"))
        context.load_verify_locations(cafile=pki.ca_cert)
        context.verify_mode = ssl.CERT_OPTIONAL
        self.context = context

    def server_context(self) -> ssl.SSLContext:
        return self.context


def _app(seen: list[dict[str, Any]]) -> web.Application:
    async def who(request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None
        ssl_object = transport.get_extra_info("ssl_object")
        der = None if ssl_object is None else ssl_object.getpeercert(binary_form=True)
        seen.append(
            {
                "remote": request.remote,
                "secure": request.secure,
                "facts": isinstance(ssl_object, TlsFacts),
                "version": None if ssl_object is None else ssl_object.version(),
                "certificate": bool(der),
                "thread": threading.current_thread().name,
            }
        )
        return web.json_response(seen[-1])

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = BIG
        await response.prepare(request)
        block = bytes(range(256)) * 4096
        for _ in range(BIG // len(block)):
            await response.write(block)
        await response.write_eof()
        return response

    async def digest(request: web.Request) -> web.Response:
        hasher, size = hashlib.sha256(), 0
        async for chunk in request.content.iter_chunked(1 << 20):
            hasher.update(chunk)
            size += len(chunk)
        return web.json_response({"sha256": hasher.hexdigest(), "bytes": size})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/who", who)
    app.router.add_get("/big", big)
    app.router.add_post("/digest", digest)
    return app


class _Served:
    def __init__(self, site: IdentitySite, port: int, workers: TlsWorkers | None) -> None:
        self.site = site
        self.port = port
        self.workers = workers
        self.refused: list[tuple[str, str, str, str]] = []
        self.seen: list[dict[str, Any]] = []


async def _serve(pki: Pki, count: int) -> AsyncIterator[_Served]:
    seen: list[dict[str, Any]] = []
    refused: list[tuple[str, str, str, str]] = []
    runner = web.AppRunner(_app(seen), shutdown_timeout=1.0)
    await runner.setup()
    sockets = listen_sockets("127.0.0.1", 0)
    workers = TlsWorkers(count, name="test-tls") if count else None
    if workers is not None:
        workers.start()
    site = IdentitySite(
        runner,
        sockets,
        contexts=cast(Any, _Contexts(pki)),
        mode=AuthMode.TLS,
        plain_ok=False,
        refused=lambda *args: refused.append(args),
        handshake_timeout_s=2.0,
        workers=workers,
    )
    await site.start()
    served = _Served(site, int(sockets[0].getsockname()[1]), workers)
    served.seen, served.refused = seen, refused
    try:
        yield served
    finally:
        await runner.cleanup()
        if workers is not None:
            await asyncio.to_thread(workers.stop)


@pytest.fixture
async def served(pki: Pki) -> AsyncIterator[_Served]:
    async for each in _serve(pki, 2):
        yield each


async def _get(port: int, context: ssl.SSLContext, path: str) -> Any:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{port}{path}", ssl=context, server_hostname="a") as r,
    ):
        assert r.status == 200, await r.text()
        return await r.json()


async def test_a_worker_does_the_handshake_and_the_loop_still_sees_the_tls_connection(
    served: _Served, pki: Pki
) -> None:
    assert served.workers is not None
    answer = await _get(served.port, pki.client("alice"), "/who")
    assert answer == {
        "remote": "127.0.0.1",
        "secure": True,
        "facts": True,
        "version": "TLSv1.3",
        "certificate": True,
        "thread": "MainThread",
    }
    assert served.workers.terminated == 1
    anonymous = await _get(served.port, pki.client(None), "/who")
    assert anonymous["certificate"] is False
    assert anonymous["secure"] is True
    assert served.workers.terminated == 2
    names = {thread.name for thread in threading.enumerate()}
    assert {"test-tls-0", "test-tls-1"} <= names


async def test_without_workers_the_loop_terminates_tls_itself(pki: Pki) -> None:
    async for served in _serve(pki, 0):
        answer = await _get(served.port, pki.client("alice"), "/who")
        assert answer["facts"] is False
        assert answer["version"] == "TLSv1.3"


async def test_large_bodies_go_both_ways_through_a_worker_with_flow_control(
    served: _Served, pki: Pki
) -> None:
    upload = os.urandom(BIG + 13)
    url = f"https://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/digest", data=io.BytesIO(upload), ssl=pki.client("alice"), server_hostname="a"
        ) as response:
            assert await response.json() == {
                "sha256": hashlib.sha256(upload).hexdigest(),
                "bytes": len(upload),
            }
        async with session.get(
            f"{url}/big", ssl=pki.client("alice"), server_hostname="a"
        ) as response:
            hasher, size = hashlib.sha256(), 0
            async for chunk in response.content.iter_chunked(256 * 1024):
                hasher.update(chunk)
                size += len(chunk)
                if size < 8 * 1024 * 1024:
                    await asyncio.sleep(0.002)  # a slow reader: every buffer fills and waits
    block = bytes(range(256)) * 4096
    assert size == BIG
    assert hasher.hexdigest() == hashlib.sha256(block * (BIG // len(block))).hexdigest()


async def test_a_refused_handshake_in_a_worker_is_named(
    served: _Served, pki: Pki, tmp_path: Path
) -> None:
    other = Pki(tmp_path / "other")
    other.root.mkdir()
    init_ca(other.ca_dir)
    other.issue("mallory", CertRole.OPERATOR)
    context = pki.client(None)
    context.load_cert_chain(other.cert("mallory"), other.key("mallory"))
    with pytest.raises((ssl.SSLError, aiohttp.ClientError)):
        await _get(served.port, context, "/who")
    deadline = time.monotonic() + 5
    while not served.refused:
        assert time.monotonic() < deadline, "the refusal was not reported"
        await asyncio.sleep(0.02)
    peer, _identity, reason, _detail = served.refused[0]
    assert peer.startswith("127.0.0.1:")
    assert reason == "other_ca", served.refused


async def test_stopping_closes_held_connections_and_stalled_handshakes(pki: Pki) -> None:
    gc.collect()  # what earlier tests of this process left is theirs
    with leaks_seen() as leaks:
        async for served in _serve(pki, 1):
            assert served.workers is not None
            threads = served.workers.threads
            # a keep-alive connection held open, and a handshake that stalls after one byte
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", served.port, ssl=pki.client("alice"), server_hostname="a"
            )
            writer.write(b"GET /who HTTP/1.1\r\nHost: a\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            stalled = socket.create_connection(("127.0.0.1", served.port))
            stalled.sendall(b"\x16")
            await asyncio.sleep(0.2)
        started = time.monotonic()
        assert await reader.read() is not None  # the server's end went away
        assert time.monotonic() - started < 5
        writer.close()
        stalled.close()
        assert not any(thread.is_alive() for thread in threads)
    assert leaks == [], leaks


async def test_a_worker_whose_loop_stopped_makes_the_check_unhealthy_and_hands_nothing(
    pki: Pki,
) -> None:
    workers = TlsWorkers(2, name="check-tls", hand_over_s=0.2)
    workers.start()
    try:
        healthy = await workers.check()
        assert healthy.status is HealthStatus.HEALTHY
        assert healthy.metrics["workers"] == 2
        stuck = workers._workers[0].loop  # a worker whose loop stops
        stuck.call_soon_threadsafe(stuck.stop)
        workers.threads[0].join(5)
        found = await workers.check()
        assert found.status is HealthStatus.UNHEALTHY
        assert "check-tls-0" in found.message
        assert "check-tls-1" not in found.message
        # a connection handed to it is closed, not left waiting or open
        server, client = socket.socketpair()
        try:
            with pytest.raises((TimeoutError, ConnectionResetError)):
                await workers.terminate(server, _Contexts(pki).server_context(), 0.1)
            assert server.fileno() == -1
        finally:
            client.close()
    finally:
        workers.stop()


def test_the_default_is_a_quarter_of_the_cpus_at_most_four_and_none_below_four() -> None:
    assert [default_tls_workers(cpus) for cpus in (1, 2, 3, 4, 8, 16, 128)] == [0, 0, 0, 1, 2, 4, 4]


def test_a_bad_worker_count_is_refused_naming_the_field(tmp_path: Path, pki: Pki) -> None:
    flags = {"data_dir": tmp_path, "node_id": "a", "tls": pki.node_tls("a", workers=-1)}
    with pytest.raises(ConfigError, match=r"tls\.workers"):
        load_settings(env={}, flags=flags)
    flags["tls"] = pki.node_tls("a", workers=3)
    assert load_settings(env={}, flags=flags).settings.tls.worker_count == 3  # type: ignore[union-attr]


class _TlsLike(asyncio.Transport):
    """A transport that, as asyncio's TLS transport does, cannot write EOF and forgets its
    connection on a second close()."""

    def __init__(self) -> None:
        super().__init__()
        self.closes = 0
        self.detached = False

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self.closes > 0

    def close(self) -> None:
        self.closes += 1
        self.detached = self.closes > 1


def test_the_daemons_end_closing_closes_the_tls_side_once() -> None:
    live: set[asyncio.Transport] = set()
    secure, plain = _Relay(live), _Relay(live)
    secure.peer, plain.peer = plain, secure
    tls = _TlsLike()
    secure.connection_made(tls)
    plain.eof_received()  # the daemon closed its end: EOF, then the pair's connection_lost
    plain.connection_lost(None)
    assert tls.closes == 1
    assert not tls.detached  # so a worker that stops can still abort it
