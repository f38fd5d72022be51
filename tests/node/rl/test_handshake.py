"""The publisher's control plane beside its data: every receiver's daemon is offered the update
and asked for its acknowledgement at the same time as the others, and the trainer's digest is
under way while the rendezvous is asked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from node.errors import WeightsError
from node.rl.digest import SHA256_ALGO, Digest
from node.rl.handshake import offer_update, wait_acknowledged
from node.rl.publisher import WeightPublisher
from node.training.rendezvous import DaemonEndpoint

torch = pytest.importorskip("torch")

DIGEST = Digest(SHA256_ALGO, "ab" * 32)


async def _daemons(
    count: int, handler: Callable[[web.Request], Any]
) -> tuple[list[TestServer], dict[str, str]]:
    servers, urls = [], {}
    for index in range(count):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        urls[f"r{index}"] = str(server.make_url("")).rstrip("/")
    return servers, urls


async def test_every_receiver_is_offered_and_asked_at_once() -> None:
    """Each daemon answers only once all of them were asked: one at a time, the first would
    wait for the second, which is never asked."""
    count = 3
    arrived: dict[str, int] = {"POST": 0, "GET": 0}
    everyone = {"POST": asyncio.Event(), "GET": asyncio.Event()}

    async def handler(request: web.Request) -> web.Response:
        arrived[request.method] += 1
        if arrived[request.method] == count:
            everyone[request.method].set()
        try:
            await asyncio.wait_for(everyone[request.method].wait(), 2.0)
        except TimeoutError:
            alone = {"error": "alone", "reason": "alone", "status": 503}
            return web.json_response(alone, status=503)
        if request.method == "POST":
            return web.json_response({"run": "r", "version": 4, "offered": True})
        return web.json_response({"run": "r", "version": 4, **DIGEST.fields()})

    servers, urls = await _daemons(count, handler)
    endpoint = DaemonEndpoint(url=urls["r0"], timeout_s=5.0)
    body = {"run": "r", "version": 4}
    try:
        with ThreadPoolExecutor(4) as pool:
            offered = await asyncio.to_thread(
                offer_update, endpoint, urls, body, DIGEST, {}, 5.0, pool
            )
            assert offered == list(urls)
            acked = await asyncio.to_thread(
                wait_acknowledged, endpoint, urls, "r", 4, DIGEST, list(urls), lambda: 5.0, pool
            )
            assert acked == tuple(sorted(urls))
    finally:
        for server in servers:
            await server.close()


async def test_a_receiver_showing_another_digest_is_not_acknowledged() -> None:
    """The integrity check of the acknowledgement holds when the receivers are asked at once:
    one showing the version with another digest is never counted."""

    async def handler(request: web.Request) -> web.Response:
        shown = DIGEST if request.url.port == servers[0].port else Digest(SHA256_ALGO, "cd" * 32)
        return web.json_response({"run": "r", "version": 4, **shown.fields()})

    servers, urls = await _daemons(2, handler)
    deadline = time.monotonic() + 0.5
    try:
        with ThreadPoolExecutor(2) as pool:
            acked = await asyncio.to_thread(
                wait_acknowledged,
                DaemonEndpoint(url=urls["r0"], timeout_s=5.0),
                urls,
                "r",
                4,
                DIGEST,
                list(urls),
                lambda: deadline - time.monotonic(),
                pool,
            )
    finally:
        for server in servers:
            await server.close()
    assert acked == ("r0",)


class _CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(2)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_the_trainer_digest_runs_while_the_rendezvous_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = _CountingPool()
    seen: list[int] = []

    def rendezvous(*args: object, **kwargs: object) -> object:
        seen.append(pool.submitted)
        raise WeightsError("no rendezvous in this test")

    monkeypatch.setattr("node.rl.publisher.fetch_weights_rendezvous", rendezvous)
    model = torch.nn.Linear(64, 64)
    with WeightPublisher("r", "http://127.0.0.1:9", digest_algo=SHA256_ALGO) as publisher:
        publisher._pool = pool
        with pytest.raises(WeightsError, match="no rendezvous"):
            publisher.publish(model, 1)
    assert seen == [len(list(model.parameters()))]  # every parameter hashed in the pool first
