"""The HTTP API's listener with TLS: each accepted connection is peeked at, a TLS ClientHello
gets the handshake with the server context in use at that moment (so a reload takes effect on
the next connection, without closing the listener), plain HTTP is served where the auth mode
allows it (`hmac+tls`: from anywhere; `tls`: from this host only, signed with the cluster
secret). A handshake refused for the client's certificate is logged and counted."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from config.settings import AuthMode
from config.tls.context import TlsContexts, handshake_refusal
from node.connections import ConnectionBudget, Listening, guarded, listening_name
from node.identity.terminator import TlsWorkers, terminated

__all__ = [
    "MAX_HANDSHAKES",
    "MAX_HANDSHAKES_PER_CLIENT",
    "PEEK_TIMEOUT_S",
    "PLAIN_REFUSAL",
    "TLS_RECORD_HANDSHAKE",
    "IdentitySite",
]

log = logging.getLogger(__name__)

TLS_RECORD_HANDSHAKE = 0x16
"""The first byte of every TLS ClientHello (a handshake record); an HTTP request starts with a
letter."""
PEEK_TIMEOUT_S = 10.0
"""A connection that sends nothing within this time is closed, and so is one whose TLS
handshake takes longer (then its request head has HEAD_DEADLINE_S, node.connections)."""
MAX_HANDSHAKES = 1024
MAX_HANDSHAKES_PER_CLIENT = 16
"""Accepted connections not yet past their first byte and TLS handshake, in all and from one
client address; more are closed as they come."""

_PLAIN_BODY = b"this node serves HTTPS only (auth tls): call https://\n"
PLAIN_REFUSAL = (
    b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    + f"Content-Length: {len(_PLAIN_BODY)}\r\n\r\n".encode()
    + _PLAIN_BODY
)
"""What a plain HTTP request gets where only TLS is served, before the connection closes."""

TLS_WRITE_HIGH_BYTES = 4 * 1024 * 1024
"""Write buffer of a TLS connection before its writer waits (asyncio's default, 64 KiB, makes a
file sent through TLS wait for every 256 KiB block to drain before it reads the next)."""

Refused = Callable[[str, str, str, str], None]
"""(peer address, identity, reason, detail) of a refused handshake."""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _is_local(conn: socket.socket, address: Any) -> bool:
    """Whether a connection comes from this host: a loopback address, or this host's own
    address (a TCP connection from it to itself never leaves the host)."""
    host = str(address[0])
    try:
        own = str(conn.getsockname()[0])
    except OSError:
        return False
    return _is_loopback(host) or host == own


async def _readable(sock: socket.socket, timeout_s: float | None) -> None:
    """Wait until `sock` is readable (TimeoutError after `timeout_s`, None: no limit)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await asyncio.wait_for(readable, timeout_s)
    finally:
        loop.remove_reader(sock.fileno())


class IdentitySite(web.BaseSite):
    """An aiohttp site on the bound `sockets` (node.startup.listen_sockets) whose connections
    are TLS 1.3 (the context of `contexts.server_context()` at accept time) or, as `mode` and
    `plain_ok` allow, plain."""

    def __init__(
        self,
        runner: web.BaseRunner,
        sockets: list[socket.socket],
        *,
        contexts: TlsContexts,
        mode: AuthMode,
        plain_ok: bool,
        refused: Refused,
        budget: ConnectionBudget | None = None,
        handshake_timeout_s: float = PEEK_TIMEOUT_S,
        backlog: int = 128,
        workers: TlsWorkers | None = None,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._sockets = sockets
        self._contexts = contexts
        self._mode = mode
        self._plain_ok = plain_ok
        self._refused = refused
        self._timeout_s = handshake_timeout_s
        self._accepting: list[asyncio.Task[None]] = []
        self._connections: dict[asyncio.Task[None], socket.socket | None] = {}
        """Connections before their first byte and handshake, by the task that serves each
        (None once a TLS worker owns the socket)."""
        self.budget = budget if budget is not None else ConnectionBudget()
        self._handshaking: dict[str, int] = {}
        self._workers = workers
        """Threads that terminate TLS connections (node.identity.terminator; their owner starts
        and stops them); None: this loop does the handshakes and the encryption."""

    @property
    def name(self) -> str:
        return listening_name(self._sockets, tls=True)

    async def start(self) -> None:
        await super().start()
        self._server = Listening(self._sockets)  # type: ignore[assignment]
        self._accepting = [
            asyncio.create_task(self._accept(sock), name=f"accept {self.name}")
            for sock in self._sockets
        ]

    async def stop(self) -> None:
        accepting, self._accepting = self._accepting, []
        for task in accepting:
            task.cancel()
        await asyncio.gather(*accepting, return_exceptions=True)
        pending = dict(self._connections)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for conn in pending.values():
            if conn is not None:
                conn.close()  # a task cancelled before its first step never closed its socket
        await super().stop()

    async def _accept(self, sock: socket.socket) -> None:
        """Accept while the site runs. Each connection is accepted here, not in a future that
        `stop` could cancel after it holds the socket: cancelling the wait for readability
        leaves nothing behind."""
        while True:
            await _readable(sock, None)
            for _ in range(self._backlog):
                try:
                    conn, address = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:  # out of descriptors: wait a little rather than spin
                    log.warning("accept on %s failed: %s", self.name, exc)
                    await asyncio.sleep(0.1)
                    break
                self._admit(conn, address)

    def _admit(self, conn: socket.socket, address: Any) -> None:
        client = str(address[0])
        held = self._handshaking.get(client, 0)
        if held >= MAX_HANDSHAKES_PER_CLIENT or len(self._connections) >= MAX_HANDSHAKES:
            log.debug("closed a connection of %s: %d of its handshakes pending", client, held)
            self.budget.refused += 1
            conn.close()
            return
        self._handshaking[client] = held + 1
        task = asyncio.create_task(self._serve(conn, address))
        self._connections[task] = conn
        task.add_done_callback(self._connections.pop)
        task.add_done_callback(functools.partial(self._handshaken, client))

    def _handshaken(self, client: str, _: object = None) -> None:
        held = self._handshaking.get(client, 0) - 1
        if held > 0:
            self._handshaking[client] = held
        else:
            self._handshaking.pop(client, None)

    async def _first_byte(self, conn: socket.socket) -> bytes:
        await _readable(conn, self._timeout_s)
        return conn.recv(1, socket.MSG_PEEK)

    async def _serve(self, conn: socket.socket, address: Any) -> None:
        peer = f"{address[0]}:{address[1]}"
        loop = asyncio.get_running_loop()
        assert self._runner.server is not None
        server = guarded(self._runner.server, self.budget)
        handed = False
        try:
            conn.setblocking(False)
            first = await self._first_byte(conn)
            if not first:
                return
            if first[0] == TLS_RECORD_HANDSHAKE and self._workers is not None:
                handed = True  # the worker owns it now, and closes it when the handshake fails
                task = asyncio.current_task()
                if task in self._connections:
                    self._connections[task] = None
                ours, tls = await self._workers.terminate(
                    conn, self._contexts.server_context(), self._timeout_s
                )
                try:
                    transport, _ = await loop.connect_accepted_socket(terminated(server, tls), ours)
                except BaseException:
                    ours.close()
                    raise
                transport.set_write_buffer_limits(high=TLS_WRITE_HIGH_BYTES)
                return
            if first[0] == TLS_RECORD_HANDSHAKE:
                transport, _ = await loop.connect_accepted_socket(
                    server,
                    conn,
                    ssl=self._contexts.server_context(),
                    ssl_handshake_timeout=self._timeout_s,
                )
                handed = True
                transport.set_write_buffer_limits(high=TLS_WRITE_HIGH_BYTES)
                return
            if self._mode.accepts_hmac or (self._plain_ok and _is_local(conn, address)):
                await loop.connect_accepted_socket(server, conn)
                handed = True
                return
            log.debug("closed a plain HTTP connection from %s: this node serves TLS only", peer)
            with contextlib.suppress(OSError):
                conn.sendall(PLAIN_REFUSAL)
        except (TimeoutError, ConnectionError):
            return
        except OSError as exc:
            refusal = handshake_refusal(exc)
            if refusal is not None:
                reason, message = refusal
                self._refused(peer, "<unknown: refused in the handshake>", reason.value, message)
            else:
                log.debug("TLS handshake with %s failed: %s", peer, exc)
        finally:
            if not handed:
                conn.close()
