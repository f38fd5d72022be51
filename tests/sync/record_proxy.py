"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1 (the seam for client retry tests).

It forwards whole requests to an upstream server; it can answer 503 itself, or forward a request
and then drop the connection instead of returning the upstream's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


class FaultyProxy:
    """Counts requests; after `pass_requests` forwarded as they are, `fail_503` answers that many
    with 503, and `drop_responses` loses that many answers."""

    def __init__(self, upstream_port: int, retry_after: str = "0") -> None:
        self.upstream_port = upstream_port
        self.retry_after = retry_after
        self.pass_requests = 0
        self.fail_503 = 0
        self.drop_responses = 0
        self.requests = 0
        self.forwarded = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> FaultyProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.upstream_port
        )
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(_content_length(head))
                self.requests += 1
                if self.fail_503 > 0 and self.requests > self.pass_requests:
                    self.fail_503 -= 1
                    writer.write(
                        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: "
                        + self.retry_after.encode()
                        + b"\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n"
                        + b'{"reason":"busy"}'
                    )
                    await writer.drain()
                    continue
                upstream_writer.write(head + body)
                await upstream_writer.drain()
                self.forwarded += 1
                answer_head = await upstream_reader.readuntil(b"\r\n\r\n")
                answer = answer_head + await upstream_reader.readexactly(
                    _content_length(answer_head)
                )
                if self.drop_responses > 0:
                    self.drop_responses -= 1
                    return  # the upstream committed; the client never hears of it
                writer.write(answer)
                await writer.drain()
        finally:
            upstream_writer.close()
            with contextlib.suppress(ConnectionError):
                await upstream_writer.wait_closed()
