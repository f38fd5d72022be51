"""The peer client against MockTransport: requests are signed and complete, every failure and
every error answer maps to net's errors naming the peer, the breaker hook guards each request,
the blocking twin keeps the same contract, and the one place that makes base URLs."""

from __future__ import annotations

import contextlib
import json
import pickle
import time
import urllib.error
from collections.abc import AsyncIterator, Callable, Iterator
from email.message import Message
from typing import Any

import aiohttp
import pytest

from config import NonceCache, verify_request
from net import (
    BlockingPeerClient,
    ClientClosedError,
    Identity,
    MockTransport,
    NetError,
    PeerClient,
    PeerRequest,
    PeerRequestError,
    PeerResponse,
    PeerTimeoutError,
    RetryLater,
    base_url,
    map_peer_errors,
)

SECRET = b"0123456789abcdef0123456789abcdef"
PEER = "10.0.0.7:8770"
URL = "http://10.0.0.7:8770"


def _ok(request: PeerRequest) -> PeerResponse:
    return PeerResponse.of_json({"path": request.path_qs, "body": request.json()})


def _answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> Any:
    return lambda request: PeerResponse(status, headers or {}, body)


def _raise(exc: BaseException) -> Callable[[PeerRequest], PeerResponse]:
    def handler(request: PeerRequest) -> PeerResponse:
        raise exc

    return handler


async def _fail_with(handler: Callable[[PeerRequest], Any]) -> PeerRequestError:
    async with PeerClient(transport=MockTransport(handler)) as client:
        with pytest.raises(PeerRequestError) as caught:
            await client.get_json(PEER, "/v1/status")
    return caught.value


async def test_a_request_is_signed_with_the_secret_and_names_the_cluster() -> None:
    mock = MockTransport(_ok)
    identity = Identity(SECRET, "node-a", "prod")
    async with PeerClient(identity, transport=mock) as client:
        answer = await client.post_json(PEER, "/v1/x", {"n": 1}, params={"since": 5})
    assert answer == {"path": "/v1/x?since=5", "body": {"n": 1}}
    (request,) = mock.calls
    assert request.url == f"{URL}/v1/x?since=5"
    assert request.headers["X-Shoal-Cluster"] == "prod"
    sender = verify_request(
        SECRET, request.headers, "POST", request.path_qs, request.body, NonceCache()
    )
    assert sender == "node-a"
    with pytest.raises(Exception, match="bad signature"):
        verify_request(b"x" * 32, request.headers, "POST", request.path_qs, request.body,
                       NonceCache())  # fmt: skip


async def test_without_a_secret_only_the_cluster_header_is_sent() -> None:
    mock = MockTransport(_ok)
    async with PeerClient(Identity(None, "node-a", "dev"), transport=mock) as client:
        await client.get_json(PEER, "/v1/status")
    headers = mock.calls[0].headers
    assert headers["X-Shoal-Cluster"] == "dev"
    assert "X-Shoal-Signature" not in headers


async def test_the_timeout_comes_from_the_table_unless_the_call_names_one() -> None:
    from config import Timeouts

    mock = MockTransport(_ok)
    async with PeerClient(timeouts=Timeouts(http_request_s=4.5), transport=mock) as client:
        await client.get_json(PEER, "/a")
        await client.get_json(PEER, "/b", timeout_s=0.5)
    assert [call.timeout_s for call in mock.calls] == [4.5, 0.5]


@pytest.mark.parametrize(
    ("exc", "kind", "words"),
    [
        (TimeoutError(), PeerTimeoutError, "no answer in 10 s (timed out)"),
        (
            ConnectionRefusedError(111, "Connection refused"),
            PeerRequestError,
            "unreachable: connection refused",
        ),
        (OSError(113, "No route to host"), PeerRequestError, "unreachable: no route to host"),
        (aiohttp.ServerDisconnectedError(), PeerRequestError, "unreachable: server disconnected"),
        (aiohttp.ClientPayloadError("cut"), PeerRequestError, "answer cut short: cut"),
        (aiohttp.ClientConnectionError("reset"), PeerRequestError, "unreachable: reset"),
        (aiohttp.ServerTimeoutError("slow"), PeerTimeoutError, "no answer in 10 s"),
    ],
)
async def test_every_transport_failure_maps_to_a_peer_error_naming_the_peer(
    exc: BaseException, kind: type[PeerRequestError], words: str
) -> None:
    error = await _fail_with(_raise(exc))
    assert type(error) is kind
    assert error.status is None
    assert str(error).startswith(f"{URL}/v1/status: ")
    assert words in str(error)
    assert error.__cause__ is exc


async def test_an_answer_that_is_not_json_is_a_peer_error() -> None:
    error = await _fail_with(_answer(200, b"<html>"))
    assert type(error) is PeerRequestError
    assert "not a JSON answer" in str(error)


async def test_the_wire_error_shape_keeps_the_nodes_reason_code_and_status() -> None:
    body = b'{"error": "insufficient_storage", "reason": "disk full", "status": 507}'
    error = await _fail_with(_answer(507, body))
    assert type(error) is PeerRequestError
    assert (error.status, error.code, error.reason) == (507, "insufficient_storage", "disk full")
    assert str(error) == f"{URL}/v1/status: HTTP 507: disk full (insufficient_storage)"


async def test_another_servers_error_page_is_its_text() -> None:
    error = await _fail_with(_answer(502, b"Bad Gateway from nginx"))
    assert (error.status, error.code) == (502, "bad_gateway")
    assert error.reason == "Bad Gateway from nginx"


@pytest.mark.parametrize("status", [429, 503])
async def test_429_and_503_with_retry_after_are_retry_later(status: int) -> None:
    body = json.dumps({"error": "busy", "reason": "queue full", "status": status}).encode()
    error = await _fail_with(_answer(status, body, {"Retry-After": "3"}))
    assert isinstance(error, RetryLater)
    assert (error.status, error.retry_after_s, error.reason) == (status, 3.0, "queue full")


async def test_503_without_retry_after_is_a_plain_peer_error() -> None:
    error = await _fail_with(_answer(503, b'{"error": "unavailable", "reason": "no leader"}'))
    assert type(error) is PeerRequestError


async def test_check_false_returns_the_error_answer() -> None:
    async with PeerClient(transport=MockTransport(_answer(404, b"{}"))) as client:
        answer = await client.request("GET", PEER, "/v1/x", check=False)
    assert answer.status == 404


def test_peer_errors_survive_a_pickle_with_their_fields() -> None:
    error = RetryLater("http://n:1/v1/x", "busy", 429, 2.5, code="too_many")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RetryLater
    assert (copy.url, copy.reason, copy.status, copy.retry_after_s, copy.code, str(copy)) == (
        error.url, error.reason, error.status, error.retry_after_s, error.code, str(error),
    )  # fmt: skip
    assert isinstance(pickle.loads(pickle.dumps(PeerTimeoutError("u", "slow"))), TimeoutError)


def test_map_peer_errors_passes_a_bug_and_a_net_error_unchanged() -> None:
    with pytest.raises(KeyError), map_peer_errors(URL):
        raise KeyError("a bug stays a bug")
    error = PeerRequestError(URL, "mine")
    with pytest.raises(PeerRequestError) as caught, map_peer_errors(URL):
        raise error
    assert caught.value is error
    assert isinstance(error, NetError)


class _Breaker:
    """Counts entries and the exceptions that leave it, per key; refuses while `open`."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.failures: list[tuple[str, type[BaseException]]] = []
        self.open = False

    def __call__(self, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        @contextlib.asynccontextmanager
        async def guard() -> AsyncIterator[None]:
            if self.open:
                raise RuntimeError(f"circuit {key} open")
            self.entered.append(key)
            try:
                yield
            except Exception as exc:
                self.failures.append((key, type(exc)))
                raise

        return guard()


async def test_the_breaker_hook_guards_every_request_and_counts_only_the_peers_failures() -> None:
    breaker = _Breaker()
    answers = iter([
        _ok,
        _answer(404, b'{"error": "not_found", "reason": "no such job"}'),
        _answer(500, b'{"error": "internal_error", "reason": "boom"}'),
        _raise(ConnectionResetError(104, "reset")),
    ])  # fmt: skip
    mock = MockTransport(lambda request: next(answers)(request))
    async with PeerClient(breaker=breaker, transport=mock) as client:
        await client.get_json(PEER, "/1", breaker_key="node-b")
        for path in ("/2", "/3", "/4"):
            with pytest.raises(PeerRequestError):
                await client.get_json(PEER, path, breaker_key="node-b")
        breaker.open = True
        with pytest.raises(RuntimeError, match=r"circuit http://10\.0\.0\.7:8770 open"):
            await client.get_json(PEER, "/5")
    assert breaker.entered == ["node-b"] * 4
    assert breaker.failures == [("node-b", PeerRequestError), ("node-b", PeerRequestError)]
    assert len(mock.calls) == 4  # an open breaker sends nothing


async def test_a_stream_reads_in_pieces_and_maps_a_broken_read() -> None:
    mock = MockTransport(lambda request: PeerResponse(200, {}, b"line one\nline two\n"))
    async with PeerClient(transport=mock) as client:
        async with client.stream("GET", PEER, "/log") as stream:
            assert [line async for line in stream.iter_lines()] == [b"line one\n", b"line two\n"]
        async with client.stream("GET", PEER, "/log") as stream:
            assert [c async for c in stream.iter_chunks(7)] == [b"line on", b"e\nline ", b"two\n"]
        with pytest.raises(OSError, match="disk full"):  # the caller's own error passes
            async with client.stream("GET", PEER, "/log"):
                raise OSError("disk full")
    missing = MockTransport(_answer(404, b'{"error": "not_found", "reason": "gone"}'))
    async with PeerClient(transport=missing) as client:
        with pytest.raises(PeerRequestError, match="HTTP 404: gone"):
            async with client.stream("GET", PEER, "/log"):
                pass


async def test_a_closed_client_refuses_requests() -> None:
    mock = MockTransport(_ok)
    client = PeerClient(transport=mock)
    await client.close()
    await client.close()
    assert mock.closed
    with pytest.raises(ClientClosedError):
        await client.get_json(PEER, "/v1/status")


def test_the_blocking_twin_signs_maps_and_guards_alike() -> None:
    entered: list[str] = []

    @contextlib.contextmanager
    def breaker(key: str) -> Iterator[None]:
        entered.append(key)
        yield

    mock = MockTransport(_ok)
    with BlockingPeerClient(Identity(SECRET, "trainer-0"), breaker=breaker, transport=mock) as c:
        assert c.call_json("POST", PEER, "/v1/x", {"a": 1}) == (200, {"path": "/v1/x", "body":
                                                                      {"a": 1}})  # fmt: skip
    request = mock.calls[0]
    assert verify_request(SECRET, request.headers, "POST", "/v1/x", request.body,
                          NonceCache()) == "trainer-0"  # fmt: skip
    assert entered == [URL]
    failing = BlockingPeerClient(transport=MockTransport(_raise(TimeoutError())))
    with pytest.raises(PeerTimeoutError, match="no answer in 10 s"):
        failing.call_json("GET", PEER, "/v1/status")
    later = b'{"error": "busy", "reason": "later"}'
    busy = MockTransport(_answer(429, later, {"Retry-After": "1"}))
    with pytest.raises(RetryLater):
        BlockingPeerClient(transport=busy).call_json("GET", PEER, "/v1/x")


def test_the_blocking_twins_breaker_counts_only_the_peers_failures() -> None:
    failures: list[int | None] = []

    @contextlib.contextmanager
    def breaker(key: str) -> Iterator[None]:
        try:
            yield
        except PeerRequestError as exc:
            failures.append(exc.status)
            raise

    answers = iter([
        _answer(404, b'{"error": "not_found", "reason": "no such job"}'),
        _answer(500, b'{"error": "internal_error", "reason": "boom"}'),
    ])  # fmt: skip
    mock = MockTransport(lambda request: next(answers)(request))
    client = BlockingPeerClient(breaker=breaker, transport=mock)
    with pytest.raises(PeerRequestError, match="HTTP 404: no such job"):
        client.request("GET", PEER, "/1")
    with pytest.raises(PeerRequestError, match="HTTP 500: boom"):
        client.request("GET", PEER, "/2")
    assert failures == [500]


def test_urllib_failures_map_like_aiohttps() -> None:
    headers = Message()
    headers["Retry-After"] = "2"
    answered = urllib.error.HTTPError(URL, 503, "busy", headers, None)
    with pytest.raises(RetryLater) as caught, map_peer_errors(URL):
        raise answered
    assert caught.value.retry_after_s == 2.0
    with pytest.raises(PeerTimeoutError), map_peer_errors(URL, 1.0):
        raise urllib.error.URLError(TimeoutError("timed out"))
    with pytest.raises(PeerRequestError, match="unreachable: connection refused"), \
            map_peer_errors(URL):  # fmt: skip
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))


@pytest.mark.parametrize(
    ("address", "tls", "url"),
    [
        ("10.0.0.7:8770", False, "http://10.0.0.7:8770"),
        ("10.0.0.7:8770", True, "https://10.0.0.7:8770"),
        ("http://node-a:80/", True, "https://node-a:80"),
        ("https://node-a:443/v1", False, "https://node-a:443"),
        ("[fd00::2]:8770", False, "http://[fd00::2]:8770"),
        ("fd00::2:8770", False, "http://[fd00::2]:8770"),
    ],
)
def test_base_url_is_made_in_one_place(address: str, tls: bool, url: str) -> None:
    assert base_url(address, tls=tls) == url


def test_an_address_without_a_port_is_refused() -> None:
    with pytest.raises(PeerRequestError, match="not a peer address"):
        base_url("node-a")


async def test_the_tls_seam_switches_the_scheme() -> None:
    import ssl

    context: list[ssl.SSLContext | None] = [None]
    mock = MockTransport(_ok)
    async with PeerClient(ssl_context=lambda: context[0], transport=mock) as client:
        assert client.base_url(PEER) == URL
        context[0] = ssl.create_default_context()
        assert client.base_url(PEER) == "https://10.0.0.7:8770"
        await client.get_json(PEER, "/v1/status")
    assert mock.calls[0].base == "https://10.0.0.7:8770"


async def test_the_per_peer_tls_choice_picks_the_scheme_and_the_name() -> None:
    import ssl

    context = ssl.create_default_context()
    asked: list[str] = []

    def choose(netloc: str) -> tuple[ssl.SSLContext, str] | None:
        asked.append(netloc)
        return (context, "node-b") if netloc.startswith("10.0.0.7") else None

    mock = MockTransport(_ok)
    async with PeerClient(tls=choose, transport=mock) as client:
        # the choice wins over the scheme a caller wrote
        assert client.base_url(f"http://{PEER}/") == "https://10.0.0.7:8770"
        assert client.base_url("10.0.0.8:8770") == "http://10.0.0.8:8770"
        assert client.base_url("https://10.0.0.8:8770") == "https://10.0.0.8:8770"
        await client.get_json(URL, "/v1/status")
        await client.get_json("10.0.0.8:8770", "/v1/status")
    assert "10.0.0.7:8770" in asked
    assert mock.calls[0].base == "https://10.0.0.7:8770"
    assert mock.calls[0].tls == (context, "node-b")
    assert mock.calls[1].base == "http://10.0.0.8:8770"
    assert mock.calls[1].tls is None


async def test_readexactly_past_the_end_is_an_answer_cut_short() -> None:
    mock = MockTransport(lambda request: PeerResponse(200, {}, b"abc"))
    async with PeerClient(transport=mock) as client, client.stream("GET", PEER, "/f") as stream:
        assert await stream.readexactly(2) == b"ab"
        with pytest.raises(PeerRequestError, match="answer cut short: 1 of 5 bytes"):
            await stream.readexactly(5)


async def test_params_are_encoded_as_aiohttp_encodes_them_keeping_slashes() -> None:
    mock = MockTransport(_ok)
    async with PeerClient(transport=mock) as client:
        await client.get_json(PEER, "/v1/sync/models/file", params={"path": "run/a b.pt"})
    assert mock.calls[0].path_qs == "/v1/sync/models/file?path=run/a+b.pt"


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("http://10.0.0.7:8770/v1/jobs/j/logs?offset=4", (URL, "/v1/jobs/j/logs?offset=4")),
        ("http://10.0.0.7:8770", (URL, "/")),
    ],
)
def test_split_url_gives_the_base_and_the_path_as_sent(url: str, parts: tuple[str, str]) -> None:
    from net import split_url

    assert split_url(url) == parts


async def test_a_refusal_for_clock_skew_is_recorded_and_a_later_answer_clears_it() -> None:
    from config import CLOCK_SKEWS

    skewed = {"X-Shoal-Clock-Skew": "+900"}
    answers = iter([_answer(401, b'{"error": "clock_skew"}', skewed), _ok])
    mock = MockTransport(lambda request: next(answers)(request))
    async with PeerClient(Identity(SECRET, "node-a"), transport=mock) as client:
        with pytest.raises(PeerRequestError):
            await client.get_json(PEER, "/v1/status")
        assert any(PEER in line and "-900 s" in line for line in CLOCK_SKEWS.lines(time.time()))
        await client.get_json(PEER, "/v1/status")
    assert not any(PEER in line for line in CLOCK_SKEWS.lines(time.time()))
