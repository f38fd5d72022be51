"""RecordClient: batching, safe retries through a fault-injecting proxy, refusals, signing."""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config import NonceCache, verify_request
from sync import (
    IngestResult,
    RecordClient,
    RecordRejectedError,
    RecordRequestError,
    RecordStores,
    SinceQuery,
    StoreClosedError,
    parse_retry_after,
    record_routes,
    retry_delay_s,
)
from tests.sync.record_fixtures import base_url, game, server, stores
from tests.sync.record_proxy import FaultyProxy

__all__ = ["server", "stores"]


def fast_client(url: str, **options: object) -> RecordClient:
    return RecordClient(url, backoff_s=0.01, max_backoff_s=0.05, **options)  # type: ignore[arg-type]


async def test_batches_sum_to_one_result(server: TestServer, stores: RecordStores) -> None:
    async with fast_client(base_url(server), batch_size=7) as client:
        result = await client.record("games", (game(i) for i in range(50)))
        assert result == IngestResult(50, 0)
        assert await client.record("games", [game(49), game(50)]) == IngestResult(1, 1)
    assert stores["games"].status().count == 51


async def test_a_lost_answer_is_retried_and_only_adds_duplicates(
    server: TestServer, stores: RecordStores
) -> None:
    async with FaultyProxy(server.port or 0) as proxy, fast_client(proxy.url) as client:
        proxy.drop_responses = 1
        result = await client.record("games", [game(i) for i in range(10)])
        assert (proxy.forwarded, proxy.requests) == (2, 2)
        # the first attempt committed all ten; the retry finds them present
        assert result == IngestResult(accepted=0, duplicates=10)
    store = stores["games"]
    assert store.status().count == 10
    page = await store.since(SinceQuery(limit=100))
    assert [r["game_id"] for r in page.records] == [f"g-{i:06d}" for i in range(10)]


async def test_503_is_retried_after_retry_after(server: TestServer) -> None:
    async with FaultyProxy(server.port or 0, retry_after="0") as proxy:
        proxy.fail_503 = 2
        async with fast_client(proxy.url) as client:
            assert await client.record("games", [game(1)]) == IngestResult(1, 0)
        assert (proxy.requests, proxy.forwarded) == (3, 1)
        proxy.fail_503 = 10
        async with fast_client(proxy.url, retries=2) as client:
            with pytest.raises(
                RecordRequestError, match="gave up after 3 attempts: HTTP 503: busy"
            ) as info:
                await client.record("games", [game(2)])
        assert info.value.status == 503


async def test_rejection_is_raised_once_with_the_servers_reason(server: TestServer) -> None:
    async with FaultyProxy(server.port or 0) as proxy, fast_client(proxy.url) as client:
        records = [game(i) for i in range(5)]
        records[3]["winner"] = "black"
        with pytest.raises(RecordRejectedError) as info:
            await client.record("games", records)
        assert str(info.value) == "records[3].winner: expected integer"
        assert (info.value.status, info.value.index, info.value.field) == (400, 3, "winner")
        assert proxy.requests == 1
        with pytest.raises(RecordRejectedError, match="unknown record store") as unknown:
            await client.record("nope", [game(1)])
        assert unknown.value.status == 404


async def test_unreachable_node_gives_up_with_a_request_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with fast_client(f"http://127.0.0.1:{port}", retries=2) as client:
        with pytest.raises(RecordRequestError, match="gave up after 3 attempts"):
            await client.record("games", [game(1)])
    with pytest.raises(StoreClosedError):
        await client.record("games", [game(1)])
    with pytest.raises(StoreClosedError):
        client.open()


def verifying(secret: bytes, seen: list[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    nonces = NonceCache()

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        body = await request.read()
        seen.append(
            verify_request(secret, request.headers, request.method, request.path_qs, body, nonces)
        )
        return await handler(request)

    return middleware


async def test_secret_file_signs_every_request(tmp_path: Path, stores: RecordStores) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"0123456789abcdef0123456789abcdef")
    secret_file.chmod(0o600)
    seen: list[str] = []
    app = web.Application(middlewares=[verifying(secret_file.read_bytes(), seen)])
    app.add_routes(record_routes(stores, "node-a"))
    signed = TestServer(app, host="127.0.0.1", port=0)
    await signed.start_server()
    try:
        async with fast_client(
            base_url(signed), secret_file=secret_file, node_id="selfplay-3"
        ) as client:
            assert await client.record("games", [game(1)]) == IngestResult(1, 0)
    finally:
        await signed.close()
    assert seen == ["selfplay-3"]


def test_retry_delay_backs_off_caps_and_honours_retry_after() -> None:
    assert retry_delay_s(0, None, rand=lambda: 0.0) == pytest.approx(0.2)
    assert retry_delay_s(3, None, rand=lambda: 0.0) == pytest.approx(1.6)
    assert retry_delay_s(20, None, rand=lambda: 0.0) == pytest.approx(10.0)
    assert retry_delay_s(0, 4.0, rand=lambda: 0.0) == pytest.approx(4.0)
    assert retry_delay_s(0, 4.0, rand=lambda: 1.0) == pytest.approx(6.0)


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("100000") == 60.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = time.time()
    assert parse_retry_after(formatdate(now + 10, usegmt=True), now=now) == pytest.approx(10, abs=1)
