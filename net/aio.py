"""The real async transport: one aiohttp ClientSession per peer (its base URL), kept open and
reused, so requests to the same peer share keep-alive connections."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import aiohttp
from yarl import URL

from net.errors import ClientClosedError
from net.transport import PeerRequest, SslContextProvider

__all__ = ["AiohttpTransport"]


class _AiohttpStream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def iter_chunks(self, size: int | None = None) -> AsyncIterator[bytes]:
        if size is None:
            async for chunk, _ in self._response.content.iter_chunks():
                yield chunk
            return
        async for chunk in self._response.content.iter_chunked(size):
            yield chunk

    async def readexactly(self, size: int) -> bytes:
        return await self._response.content.readexactly(size)

    async def iter_lines(self) -> AsyncIterator[bytes]:
        while line := await self._response.content.readline():
            yield line

    async def read(self) -> bytes:
        return await self._response.read()


def _resigning(request: PeerRequest) -> tuple[aiohttp.ClientMiddlewareType, ...]:
    """A middleware that signs each attempt after the first afresh (see PeerRequest.resign)."""
    resign = request.resign
    if resign is None:
        return ()
    attempts = 0

    async def middleware(
        sent: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        nonlocal attempts
        attempts += 1
        if attempts > 1:
            sent.headers.update(resign())
        return await handler(sent)

    return (middleware,)


class AiohttpTransport:
    """Sessions by base URL, made on first use with `limit_per_peer` connections each;
    `ssl_context` gives the TLS context per request (rotated certificates take effect on new
    connections); a request's own `tls` (context, server_hostname) wins over it. `read_bufsize`
    and `auto_decompress` are aiohttp's (bulk file transfers read with a large buffer and
    undecoded)."""

    def __init__(
        self,
        ssl_context: SslContextProvider | None = None,
        *,
        limit_per_peer: int = 64,
        read_bufsize: int = 2**16,
        auto_decompress: bool = True,
    ) -> None:
        self._ssl_context = ssl_context
        self._limit_per_peer = limit_per_peer
        self._read_bufsize = read_bufsize
        self._auto_decompress = auto_decompress
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._closed = False

    @property
    def sessions(self) -> Mapping[str, aiohttp.ClientSession]:
        """The open sessions by base URL (one per peer asked)."""
        return self._sessions

    def _session(self, base: str) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientClosedError("this peer client is closed; make a new one")
        session = self._sessions.get(base)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit_per_peer),
                raise_for_status=False,
                auto_decompress=self._auto_decompress,
                read_bufsize=self._read_bufsize,
            )
            self._sessions[base] = session
        return session

    @asynccontextmanager
    async def stream(self, request: PeerRequest) -> AsyncIterator[_AiohttpStream]:
        session = self._session(request.base)
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=request.timeout_s,
            sock_read=None if request.unbounded_reads else request.timeout_s,
        )
        context = self._ssl_context() if self._ssl_context is not None else None
        server_hostname = None
        if request.tls is not None:
            context, server_hostname = request.tls
        async with session.request(
            request.method,
            URL(request.url, encoded=True),
            middlewares=_resigning(request),
            headers=dict(request.headers),
            data=request.body if request.body or request.method not in ("GET", "HEAD") else None,
            timeout=timeout,
            ssl=context if context is not None else True,
            server_hostname=server_hostname,
            allow_redirects=False,
        ) as response:
            yield _AiohttpStream(response)

    async def aclose(self) -> None:
        """Close every session. Idempotent and irreversible."""
        self._closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()
