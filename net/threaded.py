"""ThreadedTransport: PeerClient's transport over a blocking one (urllib), each request in a
worker thread and its answer buffered. For a short command that asks a few peers at once and
should not pay for importing aiohttp (about 1 G instructions: its default TLS contexts load the
CA bundle twice), such as `cluster_monitor --once`; long-lived clients keep aiohttp's pools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from net.blocking import UrllibTransport
from net.errors import ClientClosedError
from net.transport import (
    BlockingTransport,
    PeerRequest,
    PeerResponse,
    SslContextProvider,
    iter_pieces,
)

__all__ = ["BufferedStream", "ThreadedTransport"]

MAX_THREADS = 32
"""Requests in flight at once; more wait for a thread."""


class BufferedStream:
    """A whole answer read as a PeerStream."""

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


class ThreadedTransport:
    """Sends each request with `blocking` (default a UrllibTransport with `ssl_context`) in one
    of up to `max_threads` threads. `aclose` is idempotent and irreversible."""

    def __init__(
        self,
        blocking: BlockingTransport | None = None,
        *,
        ssl_context: SslContextProvider | None = None,
        max_threads: int = MAX_THREADS,
    ) -> None:
        self._blocking = blocking or UrllibTransport(ssl_context)
        self._max_threads = max(1, max_threads)
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    @asynccontextmanager
    async def stream(self, request: PeerRequest) -> AsyncIterator[BufferedStream]:
        if self._closed:
            raise ClientClosedError("this peer client is closed; make a new one")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._max_threads, "peer-request")
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self._executor, self._blocking.send, request)
        yield BufferedStream(answer)

    async def aclose(self) -> None:
        """Stop taking requests; a request still in a thread ends within its own timeout."""
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        self._blocking.close()
