"""A fault-injecting TCP proxy for the transport tests: passes bytes through to a server on
127.0.0.1, and can flip one byte of the answers once, die partway through an answer, or stall
every answer once a number of bytes went out (until `release()`)."""

from __future__ import annotations

import asyncio
import contextlib


class FaultProxy:
    """Listens on 127.0.0.1 (port 0) and forwards to `upstream_port` (async context manager).

    `corrupt_after`: flip the byte at that offset of everything sent to clients, once.
    `die_after`: after sending that many bytes to clients, abort every connection and stop
    listening, as a host that crashed. `stall_after`: once that many bytes went to clients,
    send nothing more (connections stay open) until `release()`.
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        corrupt_after: int | None = None,
        die_after: int | None = None,
        stall_after: int | None = None,
    ) -> None:
        self._upstream_port = upstream_port
        self._corrupt_after = corrupt_after
        self._die_after = die_after
        self._stall_after = stall_after
        self._released = asyncio.Event()
        self._sent = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.corrupted = False
        self.dead = False
        self.port = 0
        self.connections = 0
        self.peak_connections = 0
        """Client connections accepted, and the most open at once."""

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def release(self) -> None:
        """Stop stalling: answers flow again, on stalled and new connections."""
        self._stall_after = None
        self._released.set()

    async def close(self) -> None:
        self._released.set()
        self._die()
        if self._server is not None:
            await self._server.wait_closed()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)

    def _die(self) -> None:
        self.dead = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        self.connections += 1
        self.peak_connections = max(self.peak_connections, len(self._handlers))
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            if self.dead:
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self._upstream_port
            )
            self._writers.add(upstream_writer)
            await asyncio.gather(
                self._pipe(reader, upstream_writer, False),
                self._pipe(upstream_reader, writer, True),
            )
        except (ConnectionError, OSError):
            pass
        finally:
            for stream in (writer, upstream_writer):
                if stream is not None:
                    self._writers.discard(stream)
                    stream.transport.abort()
            self._handlers.discard(task)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, downstream: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while not self.dead:
                if downstream and self._stall_after is not None and self._sent >= self._stall_after:
                    await self._released.wait()
                chunk = await reader.read(64 << 10)
                if not chunk:
                    break
                if downstream:
                    chunk = self._fault(chunk)
                writer.write(chunk)
                await writer.drain()
                if self.dead:
                    break
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            if writer.can_write_eof() and not writer.transport.is_closing():
                writer.write_eof()

    def _fault(self, chunk: bytes) -> bytes:
        start, end = self._sent, self._sent + len(chunk)
        self._sent = end
        at = self._corrupt_after
        if at is not None and not self.corrupted and start <= at < end:
            damaged = bytearray(chunk)
            damaged[at - start] ^= 0xFF
            chunk = bytes(damaged)
            self.corrupted = True
        if self._die_after is not None and end >= self._die_after:
            chunk = chunk[: max(0, self._die_after - start)]
            asyncio.get_running_loop().call_soon(self._die)
        return chunk
