"""PeerClient: every request of a node (or a command) to a peer, signed, within a timeout of the
table, through the peer's breaker, with failures raised as net's errors naming the peer."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from config.closing import AsyncClosing
from config.timeouts import Timeouts
from net.build import Identity, Params, base_url
from net.errors import answer_error, map_peer_errors
from net.exchange import (
    FAILURE_STATUS,
    answer_failure,
    answer_json,
    call_request,
    note_clock_skew,
    seam_base_url,
    sign_again,
)
from net.transport import (
    AsyncTransport,
    PeerRequest,
    PeerResponse,
    PeerStream,
    PeerTls,
    SslContextProvider,
)

__all__ = ["BreakerHook", "PeerClient", "note_clock_skew"]

BreakerHook = Callable[[str], AbstractAsyncContextManager[Any]]
"""The breaker of a peer, by its key (a node id, else its base URL): an async context manager
that refuses to enter while open and counts an exception leaving it as the peer's failure
(health.BreakerRegistry.breaker_for fits)."""


class _MappedStream:
    """A transport's stream whose reads raise net's errors."""

    def __init__(self, inner: PeerStream, url: str, timeout_s: float) -> None:
        self._inner = inner
        self._url = url
        self._timeout_s = timeout_s

    @property
    def status(self) -> int:
        return self._inner.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._inner.headers

    async def iter_chunks(self, size: int | None = None) -> AsyncIterator[bytes]:
        with map_peer_errors(self._url, self._timeout_s):
            async for chunk in self._inner.iter_chunks(size):
                yield chunk

    async def readexactly(self, size: int) -> bytes:
        with map_peer_errors(self._url, self._timeout_s):
            return await self._inner.readexactly(size)

    async def iter_lines(self) -> AsyncIterator[bytes]:
        with map_peer_errors(self._url, self._timeout_s):
            async for line in self._inner.iter_lines():
                yield line

    async def read(self) -> bytes:
        with map_peer_errors(self._url, self._timeout_s):
            return await self._inner.read()


class PeerClient(AsyncClosing):
    """Requests to peers, each signed as `identity`, within `timeout_s` (default: the table's
    `http_request_s`), through `breaker(key)` when given.

    `ssl_context` is the TLS seam: a callable giving the client context (or None) for the next
    connection; while it gives a context, `base_url` makes https URLs of addresses. `tls` is the
    per-peer seam (a node's): for each peer's `host:port` its (context, server_hostname), or
    None for plain http; where it gives one, the peer's URL is https whatever scheme the caller
    wrote, and the handshake checks that the peer's certificate carries that name. `transport`
    replaces the real one (one aiohttp session per peer, kept alive, with `limit_per_peer`,
    `read_bufsize` and `auto_decompress` as net.aio.AiohttpTransport's) with e.g. MockTransport.
    Use `async with`, or `close()` (idempotent; a closed client refuses requests).
    """

    def __init__(
        self,
        identity: Identity | None = None,
        *,
        timeouts: Timeouts | None = None,
        breaker: BreakerHook | None = None,
        ssl_context: SslContextProvider | None = None,
        tls: PeerTls | None = None,
        transport: AsyncTransport | None = None,
        limit_per_peer: int = 64,
        read_bufsize: int = 2**16,
        auto_decompress: bool = True,
    ) -> None:
        self.identity = identity or Identity()
        self.timeouts = timeouts or Timeouts()
        self._breaker = breaker
        self._ssl_context = ssl_context
        self._tls = tls
        if transport is None:
            from net.aio import AiohttpTransport  # here: `import net.client` without aiohttp

            transport = AiohttpTransport(
                ssl_context,
                limit_per_peer=limit_per_peer,
                read_bufsize=read_bufsize,
                auto_decompress=auto_decompress,
            )
        self.transport: AsyncTransport = transport

    def base_url(self, address: str) -> str:
        """The base URL of the peer at `address` (HOST:PORT or a URL): https where the per-peer
        seam (`tls`) gives the peer a context or while the TLS seam gives one, else http. The
        one place the scheme is chosen."""
        return self._route(address)[0]

    def _route(self, address: str) -> tuple[str, tuple[ssl.SSLContext, str] | None]:
        """(base URL, the per-peer TLS choice or None) of the peer at `address`."""
        if self._tls is not None:
            plain = base_url(address)
            choice = self._tls(plain.split("://", 1)[1])
            if choice is not None:
                return base_url(address, tls=True), choice
            if plain.startswith("https://"):
                return plain, None
        return seam_base_url(address, self._ssl_context), None

    def _guard(self, request: PeerRequest, key: str | None) -> AbstractAsyncContextManager[Any]:
        if self._breaker is None:
            return contextlib.nullcontext()
        return self._breaker(key or request.base)

    async def request(
        self,
        method: str,
        peer: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        breaker_key: str | None = None,
        check: bool = True,
    ) -> PeerResponse:
        """One request to `peer` (HOST:PORT or a base URL), its whole answer read within the
        timeout. With `check`, an error answer raises answer_error's error (RetryLater for a
        429/503 with Retry-After); without, it is returned. No answer: PeerRequestError, or
        PeerTimeoutError after `timeout_s`. Failures and answers >= 500 count against the
        breaker of `breaker_key` (default: the base URL)."""
        base, tls = self._route(peer)

        def signed() -> PeerRequest:
            return call_request(
                self.identity, self.timeouts, method, base, path, json=json, data=data,
                params=params, headers=headers, timeout_s=timeout_s, tls=tls,
            )  # fmt: skip

        request = signed()
        async with self._guard(request, breaker_key):
            answer = await self._send(request)
            if sign_again(self.identity, request, answer.status, answer.headers):
                request = signed()
                answer = await self._send(request)
            failure = answer_failure(request, answer, check=check)
            if failure is not None and answer.status >= FAILURE_STATUS:
                raise failure  # the peer's fault: its breaker counts it
        if failure is not None:
            raise failure  # a refused request: the caller's
        return answer

    async def _send(self, request: PeerRequest) -> PeerResponse:
        with map_peer_errors(request.url, request.timeout_s):
            async with asyncio.timeout(request.timeout_s):
                async with self.transport.stream(request) as stream:
                    return PeerResponse(stream.status, stream.headers, await stream.read())

    async def request_json(
        self,
        method: str,
        peer: str,
        path: str,
        body: Any = None,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        breaker_key: str | None = None,
    ) -> Any:
        """The JSON answer (None for an empty body) of `method` with `body` as JSON (None: no
        body); errors as `request`, and PeerRequestError for an answer that is not JSON."""
        answer = await self.request(
            method, peer, path, json=body, params=params, headers=headers, timeout_s=timeout_s,
            breaker_key=breaker_key,
        )  # fmt: skip
        return answer_json(answer, self.base_url(peer) + path)

    async def call_json(
        self,
        method: str,
        peer: str,
        path: str,
        body: Any = None,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        breaker_key: str | None = None,
    ) -> tuple[int, Any]:
        """(status, JSON answer or None when empty) of `method` with `body` as JSON, an error
        answer included (its status is the caller's to read); PeerRequestError when there is
        no answer or it is not JSON."""
        answer = await self.request(
            method, peer, path, json=body, params=params, headers=headers, timeout_s=timeout_s,
            breaker_key=breaker_key, check=False,
        )  # fmt: skip
        return answer.status, answer_json(answer, self.base_url(peer) + path)

    async def get_json(
        self,
        peer: str,
        path: str,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        breaker_key: str | None = None,
    ) -> Any:
        """The JSON answer of GET `path` (None for an empty body); errors as `request`, and
        PeerRequestError for an answer that is not JSON."""
        answer = await self.request(
            "GET", peer, path, params=params, headers=headers, timeout_s=timeout_s,
            breaker_key=breaker_key,
        )  # fmt: skip
        return answer_json(answer, self.base_url(peer) + path)

    async def post_json(
        self,
        peer: str,
        path: str,
        body: Any = None,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        breaker_key: str | None = None,
    ) -> Any:
        """The JSON answer of POST `body` (as JSON) to `path`; errors as `get_json`."""
        answer = await self.request(
            "POST", peer, path, json=body, params=params, headers=headers, timeout_s=timeout_s,
            breaker_key=breaker_key,
        )  # fmt: skip
        return answer_json(answer, self.base_url(peer) + path)

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        peer: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        check: bool = True,
        unbounded_reads: bool = False,
    ) -> AsyncIterator[PeerStream]:
        """An answer read piece by piece: entered once its headers arrive (within `timeout_s`,
        which then bounds each read, not the whole body; with `unbounded_reads` reads wait as
        long as the peer is silent: a followed log). With `check`, an error answer raises as
        in `request`. Reads raise net's errors; the caller's own errors inside the block (a
        full disk) pass unchanged."""
        base, tls = self._route(peer)
        for attempt in range(2):
            request = call_request(
                self.identity, self.timeouts, method, base, path, json=json, data=data,
                params=params, headers=headers, timeout_s=timeout_s, tls=tls,
            )  # fmt: skip
            if unbounded_reads:
                request = dataclasses.replace(request, unbounded_reads=True)
            opened = self.transport.stream(request)
            with map_peer_errors(request.url, request.timeout_s):
                async with asyncio.timeout(request.timeout_s):
                    inner = await opened.__aenter__()
            if attempt or not sign_again(self.identity, request, inner.status, inner.headers):
                break
            await opened.__aexit__(None, None, None)
        try:
            note_clock_skew(request, inner.status, inner.headers)
            stream = _MappedStream(inner, request.url, request.timeout_s)
            if check and inner.status >= 400:
                raise answer_error(request.url, inner.status, await stream.read(), inner.headers)
            yield stream
        except BaseException as exc:
            if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await opened.__aexit__(None, None, None)

    async def close(self) -> None:
        """Close every session. Idempotent and irreversible."""
        await self.transport.aclose()
