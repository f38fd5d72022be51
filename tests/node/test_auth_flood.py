"""Refuse before reading: the auth middleware checks the signature headers before it reads a
body, so a flood of large unsigned POSTs costs the daemon no memory."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer

from config import signed_headers
from node.limits import MAX_SMALL_BODY_READS_PER_CLIENT
from node.security import (
    AUTH_POLICY,
    AuthPolicy,
    auth_middleware,
    error_middleware,
)
from tests.cluster.waiting import WaitTimeoutError, wait_until
from tests.node.test_openapi_fuzz import _daemon, _secret

SECRET = b"0123456789abcdef0123456789abcdef"
FLOOD = 16
FLOOD_BYTES = 60 * 1024 * 1024
RSS_MARGIN_BYTES = 64 * 1024 * 1024
SETTLE_READINGS = 5
SETTLE_INTERVAL_S = 0.2
SETTLE_BYTES = 2 * 1024 * 1024
SETTLE_TIMEOUT_S = 60.0


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _settled_rss_bytes(pid: int) -> int:
    """The resident memory of `pid` once its start-up has settled: SETTLE_READINGS readings in a
    row, SETTLE_INTERVAL_S apart, within SETTLE_BYTES of each other."""
    readings: list[int] = []

    def settled() -> int:
        readings.append(_rss_bytes(pid))
        window = readings[-SETTLE_READINGS:]
        steady = len(window) == SETTLE_READINGS and max(window) - min(window) <= SETTLE_BYTES
        return window[-1] if steady else 0

    try:
        return wait_until(settled, SETTLE_TIMEOUT_S, SETTLE_INTERVAL_S)
    except WaitTimeoutError as exc:
        last = [f"{r / 2**20:.1f}" for r in readings[-SETTLE_READINGS:]]
        what = f"the daemon's RSS never settled after start-up: last readings {last} MiB"
        raise WaitTimeoutError(what) from exc


async def _app(reads: list[int]) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        reads.append(len(body))
        return web.json_response({"bytes": len(body)})

    app = web.Application(
        middlewares=[error_middleware, auth_middleware], client_max_size=8 * 1024 * 1024
    )
    app[AUTH_POLICY] = AuthPolicy(secret=SECRET)
    app.router.add_post("/v1/echo", echo)
    return app


async def test_bad_headers_are_refused_before_the_body_is_read() -> None:
    reads: list[int] = []
    app = await _app(reads)
    read_calls = 0
    original = web.Request.read

    async def counting_read(self: web.Request) -> bytes:
        nonlocal read_calls
        read_calls += 1
        return await original(self)

    web.Request.read = counting_read  # type: ignore[method-assign]
    try:
        async with TestClient(TestServer(app)) as client:
            body = b"x" * (2 * 1024 * 1024)  # above SKEW_PROBE_MAX_BYTES: never read if refused
            stale = signed_headers(SECRET, "b", "POST", "/v1/echo", body, now=time.time() - 900)
            replayed = signed_headers(SECRET, "b", "POST", "/v1/echo", body)
            cases = [
                ({}, "missing signature headers"),
                (stale, "(limit 300 s)"),
                ({**replayed, "X-Shoal-Nonce": "zz"}, "nonce must be"),
            ]
            for headers, reason in cases:
                response = await client.post("/v1/echo", data=io.BytesIO(body), headers=headers)
                assert response.status == 401
                assert reason in (await response.json())["reason"]
            assert read_calls == 0  # not one body was read for them
            ok = await client.post("/v1/echo", data=io.BytesIO(body), headers=replayed)
            assert ok.status == 200
            again = await client.post("/v1/echo", data=io.BytesIO(body), headers=replayed)
            assert again.status == 401
            assert "replayed" in (await again.json())["reason"]
            assert read_calls == 2  # the signed request's body (middleware, then the handler)
            assert reads == [len(body)]
    finally:
        web.Request.read = original  # type: ignore[method-assign]


async def test_at_most_a_few_bodies_are_read_at_once() -> None:
    policy = AuthPolicy(secret=SECRET)
    app = await _app([])
    app[AUTH_POLICY] = policy
    inside = 0
    most = 0
    original = web.Request.read

    async def slow_read(self: web.Request) -> bytes:
        nonlocal inside, most
        if self.content.at_eof():  # the handler's read of the body the middleware read
            return await original(self)
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.05)
        inside -= 1
        return await original(self)

    web.Request.read = slow_read  # type: ignore[method-assign]
    try:
        async with TestClient(TestServer(app)) as client:

            async def one() -> int:
                body = b"y" * 100
                headers = signed_headers(SECRET, "b", "POST", "/v1/echo", body)
                response = await client.post("/v1/echo", data=io.BytesIO(body), headers=headers)
                return response.status

            statuses = await asyncio.gather(*(one() for _ in range(12)))
    finally:
        web.Request.read = original  # type: ignore[method-assign]
    assert statuses == [200] * 12
    assert 1 < most <= MAX_SMALL_BODY_READS_PER_CLIENT, most


async def _flood(port: int) -> list[int]:
    payload = b"\0" * FLOOD_BYTES

    async def one(session: ClientSession) -> int:
        async with session.post(
            f"http://127.0.0.1:{port}/v1/records/games",
            data=io.BytesIO(payload),  # shares `payload`'s buffer; sent with Content-Length
            headers={"Content-Type": "application/json"},
        ) as response:
            return response.status

    async with ClientSession() as session:
        return await asyncio.gather(*(one(session) for _ in range(FLOOD)))


def test_a_flood_of_unsigned_60mb_posts_leaves_memory_near_idle(tmp_path: Path) -> None:
    with _daemon(tmp_path, "--secret-file", str(_secret(tmp_path))) as (process, port):
        idle = _settled_rss_bytes(process.pid)
        peak = idle
        done = False

        async def watch() -> None:
            nonlocal peak
            while not done:
                peak = max(peak, _rss_bytes(process.pid))
                await asyncio.sleep(0.02)

        async def run() -> list[int]:
            nonlocal done
            watcher = asyncio.create_task(watch())
            try:
                return await _flood(port)
            finally:
                done = True
                await watcher

        statuses = asyncio.run(run())
        peak = max(peak, _rss_bytes(process.pid))
        assert process.poll() is None
    print(f"daemon RSS: idle {idle / 2**20:.1f} MiB, peak under the flood {peak / 2**20:.1f} MiB")
    assert statuses == [401] * FLOOD
    assert peak - idle <= RSS_MARGIN_BYTES, (idle, peak)
