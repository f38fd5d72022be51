"""Clients that attack a node's unauthenticated surface, for the security tests and
bench/flood_bench.py: slow bodies behind made-up signature headers, slow TLS request heads, and
large or compressed login posts. Each is an async context manager that cleans up on exit."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import secrets
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from config import HEADER_NODE, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP

LOGIN_FLOOD_BYTES = 60 * 1024 * 1024


@dataclass
class Attack:
    """What an attack's sockets saw: how many are still open, and how each ended."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def open_count(self) -> int:
        return sum(1 for task in self.tasks if not task.done())


def forged_headers(path: str, length: int) -> bytes:
    """A POST head with signature headers that pass the header check (a client id, a fresh
    timestamp, a new nonce) and a made-up signature."""
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        f"{HEADER_NODE}: cli-attacker",
        f"{HEADER_TIMESTAMP}: {int(time.time())}",
        f"{HEADER_NONCE}: {secrets.token_hex(16)}",
        f"{HEADER_SIGNATURE}: {'0' * 64}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _hold(
    attack: Attack, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drip: bytes,
    every_s: float,
) -> None:  # fmt: skip
    """Send `drip` every `every_s` until the node closes the connection; keep its answer."""
    answer = b""
    try:
        while True:
            try:
                answer += await asyncio.wait_for(reader.read(65536), every_s)
            except TimeoutError:
                if drip:
                    writer.write(drip)
                    await writer.drain()
                continue
            if reader.at_eof():
                break
    except (ConnectionError, OSError):
        pass
    finally:
        attack.answers.append(answer)
        writer.close()


@contextlib.asynccontextmanager
async def slow_bodies(
    port: int, count: int, *, host: str = "127.0.0.1", path: str = "/v1/jobs",
    every_s: float = 0.5,
) -> AsyncIterator[Attack]:  # fmt: skip
    """`count` sockets that announce a 1,000,000-byte body behind made-up signature headers
    and send one byte of it every `every_s`."""
    attack = Attack()
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(forged_headers(path, 1_000_000) + b"{")
            await writer.drain()
            attack.writers.append(writer)
            attack.tasks.append(asyncio.create_task(_hold(attack, reader, writer, b" ", every_s)))
        yield attack
    finally:
        await _end(attack)


@contextlib.asynccontextmanager
async def slow_tls_heads(
    port: int, count: int, context: ssl.SSLContext | None, *, server_hostname: str | None = None,
    every_s: float = 0.5,
) -> AsyncIterator[Attack]:  # fmt: skip
    """`count` TLS connections (the handshake done, with whatever certificate `context`
    presents; plain TCP when `context` is None) that send a request head, then one more byte
    of a header every `every_s`."""
    attack = Attack()
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname=server_hostname
            )
            writer.write(b"GET /v1/status HTTP/1.1\r\nHost: a\r\nX-Slow: ")
            await writer.drain()
            attack.writers.append(writer)
            attack.tasks.append(asyncio.create_task(_hold(attack, reader, writer, b"a", every_s)))
        yield attack
    finally:
        await _end(attack)


async def _end(attack: Attack) -> None:
    for writer in attack.writers:
        writer.close()
    for task in attack.tasks:
        task.cancel()
    await asyncio.gather(*attack.tasks, return_exceptions=True)


@functools.cache
def _login_body(size: int, gzipped: bool) -> bytes:
    """A login form of `size` bytes, gzip-compressed when `gzipped` (made once: compressing
    60 MiB on every post would stall the attacker's own loop, and the timings beside it)."""
    form = b"token=" + b"a" * (size - 6)
    return gzip.compress(form, compresslevel=1) if gzipped else form


async def login_post(
    port: int,
    *,
    size: int = LOGIN_FLOOD_BYTES,
    gzipped: bool = False,
    chunked: bool = False,
    early_s: float = 0.0,
) -> bytes:
    """POST /ui/login with a form of `size` bytes (gzip-compressed when `gzipped`, sent
    chunked without a Content-Length when `chunked`); the status line of the answer, or b""
    when the node closed the connection before it could be read (a node closes at once on a
    body it refuses unread). With `early_s`, the head and the first 64 KiB are sent, and an
    answer that comes within `early_s` is taken before the rest is sent (as a client that
    waits for an early refusal does)."""
    body = _login_body(size, gzipped)
    head = [
        "POST /ui/login HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/x-www-form-urlencoded",
        "Connection: close",
    ]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
    if gzipped:
        head.append("Content-Encoding: gzip")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await _send_login(reader, writer, head, body, chunked, early_s)
    finally:
        writer.close()


async def _send_login(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: list[str], body: bytes,
    chunked: bool, early_s: float,
) -> bytes:  # fmt: skip
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        view = memoryview(body)
        step = 1 << 16 if early_s else 1 << 20
        for start in range(0, len(body), step):
            piece = view[start : start + step]
            writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n" if chunked else piece)
            await writer.drain()
            if early_s and start == 0:
                with contextlib.suppress(TimeoutError):
                    return (await asyncio.wait_for(reader.readline(), early_s)).strip()
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    try:
        return (await asyncio.wait_for(reader.readline(), 30.0)).strip()
    except (ConnectionError, OSError, TimeoutError):
        return b""
