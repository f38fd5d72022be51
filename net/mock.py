"""MockTransport: a transport that hands each request to a function, for tests that need no
server (httpx's MockTransport). Works for PeerClient and BlockingPeerClient alike."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from net.errors import ClientClosedError
from net.threaded import BufferedStream
from net.transport import PeerRequest, PeerResponse

__all__ = ["MockHandler", "MockTransport"]

MockHandler = Callable[[PeerRequest], PeerResponse | Awaitable[PeerResponse]]
"""Answers one request (signed and complete, as the real transport would send it), or raises
what the network would (OSError, TimeoutError, an aiohttp ClientError) to fail it."""


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
    async def stream(self, request: PeerRequest) -> AsyncIterator[BufferedStream]:
        self._check_open()
        self.calls.append(request)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        yield BufferedStream(answer)

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
