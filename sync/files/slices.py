"""A slice of an open file sent as an HTTP answer (sendfile on plain sockets; over TLS, chunks
read ahead in a worker thread while the loop encrypts the last), under an upload rate limit,
and the single `bytes=` range a request may ask for."""

from __future__ import annotations

import asyncio
import os
import re
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sync.files.download import RateLimiter
from sync.transports.partial import settle_all

LIMITED_SEND_BYTES = 256 << 10
"""A sendfile slice or chunk under an upload cap (each waits for its tokens)."""
TLS_CHUNK_BYTES = 1 << 20
"""A chunk read for TLS, which has no sendfile (asyncio's fallback reads 16 KiB per thread
hop, ten times slower). The next chunk is read while this one is encrypted and sent."""
_RANGE = re.compile(r"bytes=(\d*)-(\d*)\Z")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) of a single `bytes=` range, None for the whole file; ValueError
    when it is malformed or unsatisfiable."""
    if header is None:
        return None
    match = _RANGE.match(header.strip())
    if match is None or (not match.group(1) and not match.group(2)):
        raise ValueError(f"unsupported Range {header!r}")
    first, last = match.group(1), match.group(2)
    if not first:
        start, end = max(0, size - int(last)), size
    else:
        start = int(first)
        end = min(size, int(last) + 1) if last else size
    if start >= size or end <= start:
        raise ValueError(f"Range {header!r} outside a file of {size} bytes")
    return start, end


class FileSlice(web.StreamResponse):
    """Sends `count` bytes of an open file from `offset`; owns and closes `fd`."""

    def __init__(
        self,
        fd: int,
        offset: int,
        count: int,
        status: int,
        headers: dict[str, str],
        limiter: RateLimiter | None = None,
        on_sent: Callable[[int], None] | None = None,
    ):
        super().__init__(status=status, headers=headers)
        self._limiter = limiter
        self._on_sent = on_sent
        self.content_length = count
        self._fd = fd
        self._offset = offset
        self._count = count
        self._close_fd = weakref.finalize(self, os.close, fd)

    async def prepare(self, request: web.BaseRequest) -> Any:
        if self.prepared:
            return await super().prepare(request)
        try:
            writer = await super().prepare(request)
            if self._count and request.method != "HEAD":
                await self._send(request, writer)
            await super().write_eof()
            return writer
        finally:
            self._close_fd()

    async def _send(self, request: web.BaseRequest, writer: Any) -> None:
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("connection lost")
        if transport.get_extra_info("sslcontext") is None:
            with os.fdopen(self._fd, "rb", buffering=0, closefd=False) as file:
                try:
                    await self._sendfile(transport, file)
                    return
                except NotImplementedError:
                    pass
        await self._send_chunks(writer)

    async def _sendfile(self, transport: asyncio.Transport, file: Any) -> None:
        loop = asyncio.get_running_loop()
        offset, end = self._offset, self._offset + self._count
        step = end - offset if self._limiter is None else LIMITED_SEND_BYTES
        while offset < end:
            count = min(step, end - offset)
            if self._limiter is not None:
                await self._limiter.take(count)
            await loop.sendfile(transport, file, offset, count)
            offset += count
            if self._on_sent is not None:
                self._on_sent(count)

    async def _send_chunks(self, writer: Any) -> None:
        """Chunks read in a worker thread, the next one while the loop encrypts and sends this
        one; a read still running when sending fails is waited for (it uses the descriptor)."""
        loop = asyncio.get_running_loop()
        offset, end = self._offset, self._offset + self._count
        step = TLS_CHUNK_BYTES if self._limiter is None else LIMITED_SEND_BYTES
        reading = loop.run_in_executor(None, os.pread, self._fd, min(step, end - offset), offset)
        try:
            while True:
                chunk = await reading
                if not chunk:
                    raise ConnectionResetError("file shrank while being sent")
                offset += len(chunk)
                if offset < end:
                    size = min(step, end - offset)
                    reading = loop.run_in_executor(None, os.pread, self._fd, size, offset)
                if self._limiter is not None:
                    await self._limiter.take(len(chunk))
                await writer.write(chunk)
                if self._on_sent is not None:
                    self._on_sent(len(chunk))
                if offset >= end:
                    return
        finally:
            await settle_all([reading])
