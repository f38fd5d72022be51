"""A slice of an open file sent as an HTTP answer (sendfile on plain sockets, reads over TLS),
under an upload rate limit, and the single `bytes=` range a request may ask for."""

from __future__ import annotations

import asyncio
import os
import re
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sync.files.download import RateLimiter

SENDFILE_FALLBACK_CHUNK = 1 << 20
LIMITED_SEND_BYTES = 256 << 10
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
    """Sends `count` bytes of an open file from `offset` with sendfile; owns and closes `fd`."""

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
        loop = asyncio.get_running_loop()
        offset, end = self._offset, self._offset + self._count
        step = end - offset if self._limiter is None else LIMITED_SEND_BYTES
        # over TLS there is no sendfile, and asyncio's own fallback reads 16 KiB per thread
        # hop, about ten times slower than the 1 MiB reads below
        if transport.get_extra_info("sslcontext") is None:
            with os.fdopen(self._fd, "rb", buffering=0, closefd=False) as file:
                try:
                    while offset < end:
                        count = min(step, end - offset)
                        if self._limiter is not None:
                            await self._limiter.take(count)
                        await loop.sendfile(transport, file, offset, count)
                        offset += count
                        if self._on_sent is not None:
                            self._on_sent(count)
                    return
                except NotImplementedError:
                    pass
        while offset < end:
            size = min(SENDFILE_FALLBACK_CHUNK, end - offset)
            if self._limiter is not None:
                await self._limiter.take(size)
            chunk = await asyncio.to_thread(os.pread, self._fd, size, offset)
            if not chunk:
                raise ConnectionResetError("file shrank while being sent")
            await writer.write(chunk)
            offset += len(chunk)
            if self._on_sent is not None:
                self._on_sent(len(chunk))
