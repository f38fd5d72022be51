"""The peer client against a real aiohttp server on 127.0.0.1 behind the node's own
middlewares: the signature verifies there, X-Shoal-Cluster is checked there, requests to one
peer share one session and its kept-alive connection, and real failures map to net's errors."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Mapping

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config import error_response
from net import (
    BlockingPeerClient,
    ClientClosedError,
    Identity,
    PeerClient,
    PeerRequestError,
    PeerTimeoutError,
    RetryLater,
    ThreadedTransport,
)
from net.aio import AiohttpTransport
from node.security import (
    AUTH_POLICY,
    PEER_ID,
    AuthPolicy,
    auth_middleware,
    foreign_cluster_middleware,
)

SECRET = b"0123456789abcdef0123456789abcdef"


async def _echo(request: web.Request) -> web.Response:
    sock = request.transport.get_extra_info("peername") if request.transport else None
    raw = await request.read()
    body = json.loads(raw) if raw else None
    return web.json_response(
        {"sender": request[PEER_ID], "query": dict(request.query), "body": body,
         "client_port": sock[1] if sock else None}
    )  # fmt: skip


async def _busy(request: web.Request) -> web.Response:
    response = error_response(503, "queue full", "busy")
    response.headers["Retry-After"] = "4"
    return response


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.json_response({})


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    app = web.Application(middlewares=[foreign_cluster_middleware, auth_middleware])
    app[AUTH_POLICY] = AuthPolicy(SECRET, cluster="prod")
    app.router.add_post("/v1/echo", _echo)
    app.router.add_get("/v1/echo", _echo)
    app.router.add_get("/v1/busy", _busy)
    app.router.add_get("/v1/slow", _slow)
    test_server = TestServer(app, host="127.0.0.1", port=0)
    async with test_server:
        yield test_server


def _address(server: TestServer) -> str:
    return f"127.0.0.1:{server.port}"


def _closed_port() -> int:
    """A port nothing listens on (bound a moment, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_the_real_middleware_verifies_the_signature_and_the_cluster(
    server: TestServer,
) -> None:
    async with PeerClient(Identity(SECRET, "node-a", "prod")) as client:
        answer = await client.post_json(
            _address(server), "/v1/echo", {"n": 1}, params={"since": "a b/c"}
        )
        assert answer["sender"] == "node-a"
        assert answer["body"] == {"n": 1}
        assert answer["query"] == {"since": "a b/c"}
    async with PeerClient(Identity(b"another secret of 32 bytes......", "node-a")) as client:
        with pytest.raises(PeerRequestError) as caught:
            await client.get_json(_address(server), "/v1/echo")
    assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    async with PeerClient(Identity(SECRET, "node-a", "test")) as client:
        with pytest.raises(PeerRequestError) as caught:
            await client.get_json(_address(server), "/v1/echo")
    assert (caught.value.status, caught.value.code) == (403, "wrong_cluster")


async def test_one_session_per_peer_and_its_connection_is_kept_alive(server: TestServer) -> None:
    transport = AiohttpTransport()
    async with PeerClient(Identity(SECRET, "node-a"), transport=transport) as client:
        ports = {
            (await client.get_json(_address(server), "/v1/echo"))["client_port"] for _ in range(5)
        }
        await client.get_json(f"http://localhost:{server.port}", "/v1/echo")
        assert len(ports) == 1  # one connection, reused
        assert sorted(transport.sessions) == [
            f"http://127.0.0.1:{server.port}",
            f"http://localhost:{server.port}",
        ]
    assert transport.sessions == {}


async def test_real_failures_map_to_net_errors(server: TestServer) -> None:
    async with PeerClient(Identity(SECRET, "node-a")) as client:
        with pytest.raises(RetryLater) as busy:
            await client.get_json(_address(server), "/v1/busy")
        assert (busy.value.retry_after_s, busy.value.code) == (4.0, "busy")
        with pytest.raises(PeerTimeoutError, match=r"no answer in 0\.2 s"):
            await client.get_json(_address(server), "/v1/slow", timeout_s=0.2)
        with pytest.raises(PeerRequestError, match="unreachable: connection refused"):
            await client.get_json(f"127.0.0.1:{_closed_port()}", "/v1/echo")


async def test_the_blocking_twin_against_the_real_middleware(server: TestServer) -> None:
    address = _address(server)

    def ask() -> tuple[int, object]:
        with BlockingPeerClient(Identity(SECRET, "trainer-0", "prod")) as client:
            return client.call_json("POST", address, "/v1/echo", {"x": 2}, params={"k": "v"})

    status, answer = await asyncio.to_thread(ask)
    assert status == 200
    assert isinstance(answer, dict)
    assert (answer["sender"], answer["body"]) == ("trainer-0", {"x": 2})
    assert answer["query"] == {"k": "v"}

    def busy() -> None:
        BlockingPeerClient(Identity(SECRET, "trainer-0")).call_json("GET", address, "/v1/busy")

    with pytest.raises(RetryLater, match="queue full"):
        await asyncio.to_thread(busy)


async def test_an_attempt_aiohttp_sends_again_is_signed_afresh() -> None:
    """aiohttp sends an idempotent request once more when a kept-alive connection drops; the
    node refuses a nonce it has seen, so the second attempt carries a new signature."""
    from types import SimpleNamespace
    from typing import Any, cast

    from config import NonceCache, verify_request
    from net import build_request
    from net.aio import _resigning

    request = build_request(Identity(SECRET, "node-a"), "GET", "http://n:1", "/v1/x", timeout_s=1.0)
    (middleware,) = _resigning(request)
    sent = SimpleNamespace(headers=dict(request.headers))
    nonces: list[str] = []

    async def handler(attempt: Any) -> Any:
        nonces.append(attempt.headers["X-Shoal-Nonce"])
        return None

    seen = NonceCache()
    for _ in range(2):
        await middleware(cast(Any, sent), cast(Any, handler))
        verify_request(SECRET, sent.headers, "GET", "/v1/x", b"", seen)
    assert nonces[0] == request.headers["X-Shoal-Nonce"] != nonces[1]


async def test_a_silent_stream_times_out_unless_its_reads_are_unbounded() -> None:
    released = asyncio.Event()

    async def quiet(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await released.wait()  # a followed log of a job that prints nothing for a while
        await response.write(b"late line\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/log", quiet)
    test_server = TestServer(app, host="127.0.0.1", port=0)
    async with test_server, PeerClient() as client:
        address = _address(test_server)
        with pytest.raises(PeerTimeoutError):
            async with client.stream("GET", address, "/log", timeout_s=0.2) as stream:
                await stream.read()
        async with client.stream(
            "GET", address, "/log", timeout_s=0.2, unbounded_reads=True
        ) as stream:
            reader = asyncio.ensure_future(stream.read())
            done, _ = await asyncio.wait([reader], timeout=0.6)
            assert not done  # three read timeouts later it still waits
            released.set()
            assert await reader == b"late line\n"


async def test_the_per_peer_tls_choice_checks_the_peers_name(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The handshake checks the name the choice gives, not the address called: a node
    certificate also valid for 127.0.0.1 is refused under another node's name."""
    import ssl

    from tests.node.tls_pki import make_pki

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"method": request.method})

    pki = make_pki(tmp_path_factory.mktemp("pki"), nodes=("node-x",))
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(pki.cert("node-x"), pki.key("node-x"))
    app = web.Application()
    app.router.add_get("/v1/hello", hello)
    test_server = TestServer(app, host="127.0.0.1", port=0)
    await test_server.start_server(ssl=served)
    try:
        address = _address(test_server)
        client_context = pki.client("alice")
        async with PeerClient(tls=lambda _: (client_context, "node-x")) as peers:
            answer = await peers.get_json(address, "/v1/hello")
            assert answer == {"method": "GET"}
            assert list(_sessions(peers)) == [f"https://{address}"]
        async with PeerClient(tls=lambda _: (client_context, "node-y")) as peers:
            with pytest.raises(PeerRequestError, match="node-y"):
                await peers.get_json(address, "/v1/hello")
    finally:
        await test_server.close()


def _sessions(peers: PeerClient) -> Mapping[str, object]:
    transport = peers.transport
    assert isinstance(transport, AiohttpTransport)
    return transport.sessions


async def test_the_threaded_transport_is_a_peer_client_without_aiohttp(server: TestServer) -> None:
    transport = ThreadedTransport(max_threads=4)
    async with PeerClient(Identity(SECRET, "monitor-a", "prod"), transport=transport) as client:
        answers = await asyncio.gather(
            *(client.get_json(_address(server), "/v1/echo", params={"i": str(i)}) for i in range(8))
        )
        assert sorted(int(a["query"]["i"]) for a in answers) == list(range(8))
        assert {a["sender"] for a in answers} == {"monitor-a"}  # signed, verified there
        with pytest.raises(RetryLater):
            await client.get_json(_address(server), "/v1/busy")
        with pytest.raises(PeerTimeoutError):
            await client.get_json(_address(server), "/v1/slow", timeout_s=0.2)
        with pytest.raises(PeerRequestError, match="unreachable: connection refused"):
            await client.get_json(f"127.0.0.1:{_closed_port()}", "/v1/echo")
    with pytest.raises(ClientClosedError):
        await client.get_json(_address(server), "/v1/echo")
