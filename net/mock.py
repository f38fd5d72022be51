"""MockTransport: a transport that hands each request to a function, for tests that need no
server (httpx's MockTransport). Works for PeerClient and BlockingPeerClient alike."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

from net.errors import ClientClosedError
from net.transport import PeerRequest, PeerResponse, iter_pieces

__all__ = ["MockHandler", "MockTransport"]

MockHandler = Callable[[PeerRequest], PeerResponse | Awaitable[PeerResponse]]
"""Answers one request (signed and complete, as the real transport would send it), or raises
what the network would (OSError, TimeoutError, an aiohttp ClientError) to fail it."""


class _MockStream:
    def __init__(self, answer: PeerResponse) -> None:
        self._answer = answer
        self._body = answer.body

    @property
    def status(self) -> int:
        return self._answer.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._answer.headers

    async def iter_chunks(self, size: int | None = None) -> AsyncIterator[bytes]:
        body, self._body = self._body, b""
        for piece in iter_pieces(body, size or len(body)):
            yield piece

    async def readexactly(self, size: int) -> bytes:
        if len(self._body) < size:
            partial, self._body = self._body, b""
            raise asyncio.IncompleteReadError(partial, size)
        piece, self._body = self._body[:size], self._body[size:]
        return piece

    async def iter_lines(self) -> AsyncIterator[bytes]:
        body, self._body = self._body, b""
        for line in body.splitlines(keepends=True):
            yield line

    async def read(self) -> bytes:
        body, self._body = self._body, b""
        return body


class MockTransport:
    """Routes every request to `handler` and records it in `calls` (in order); `closed` tells
    whether the client closed it."""

    def __init__(self, handler: MockHandler) -> None:
        self._handler = handler
        self.calls: list[PeerRequest] = []
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise ClientClosedError("this peer client is closed; make a new one")

    @asynccontextmanager
    async def stream(self, request: PeerRequest) -> AsyncIterator[_MockStream]:
        self._check_open()
        self.calls.append(request)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        yield _MockStream(answer)

    def send(self, request: PeerRequest) -> PeerResponse:
        self._check_open()
        self.calls.append(request)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            raise TypeError("a blocking client needs a handler that returns, not awaits")
        return answer

    async def aclose(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True
