"""Budgets of the connections to a node's API, before anything is known of the caller: at most
MAX_CONNECTIONS in all and MAX_CONNECTIONS_PER_CLIENT from one address, and a deadline on every
request head (the request line and headers), so slow or idle sockets cannot pile up.

`guarded(server, budget)` wraps aiohttp's protocol factory: each connection's protocol is a
ConnectionGuard in front of aiohttp's handler, which counts it, refuses one over the caps, and
closes it when a request head takes longer than HEAD_DEADLINE_S (from the connection's start,
or from the first byte after a response). `head_deadline_middleware` tells the guard when a head
is complete (aiohttp made a request of it) and when its handler is done.

Every limit here is documented in docs/security.md (a test compares the page with these)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler

from net import peer_url

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 16384
"""Open connections of the API at once (the systemd unit allows 65536 descriptors)."""
MAX_CONNECTIONS_PER_CLIENT = 256
"""Open connections from one client address; more are closed as they come."""
HEAD_DEADLINE_S = 10.0
"""A request's line and headers must arrive within this time of the connection's start (or of
the request's first byte, on a kept-alive connection); else the connection is closed."""
MAX_ADDRESSES_NOTED = 1024
"""Client addresses whose refusals were logged at WARNING once; beyond, at DEBUG only."""


@dataclass
class ConnectionBudget:
    """Open connections in all and per client address (the API's, shared by its listeners),
    and how many were refused or cut off (for tests and metrics)."""

    total: int = field(default_factory=lambda: MAX_CONNECTIONS)
    per_client: int = field(default_factory=lambda: MAX_CONNECTIONS_PER_CLIENT)
    head_deadline_s: float = field(default_factory=lambda: HEAD_DEADLINE_S)
    open: int = 0
    refused: int = 0
    cut: int = 0
    _clients: dict[str, int] = field(default_factory=dict)
    _noted: set[str] = field(default_factory=set)

    def admit(self, client: str) -> bool:
        """Count one more connection of `client`; False (nothing counted) over a cap."""
        held = self._clients.get(client, 0)
        if self.open >= self.total or held >= self.per_client:
            self.refused += 1
            self._note(client, held)
            return False
        self._clients[client] = held + 1
        self.open += 1
        return True

    def release(self, client: str) -> None:
        held = self._clients.get(client, 0) - 1
        if held > 0:
            self._clients[client] = held
        else:
            self._clients.pop(client, None)
        self.open = max(0, self.open - 1)

    def held_by(self, client: str) -> int:
        return self._clients.get(client, 0)

    def _note(self, client: str, held: int) -> None:
        first = client not in self._noted and len(self._noted) < MAX_ADDRESSES_NOTED
        if first:
            self._noted.add(client)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "refused a connection from %s: it holds %d (limit %d per client), %d open in all "
            "(limit %d)",
            client,
            held,
            self.per_client,
            self.open,
            self.total,
        )


def _client_of(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer or "unknown")


class ConnectionGuard(asyncio.Protocol):
    """The protocol of one API connection in front of aiohttp's handler: counted in the
    budget, closed over a cap, and closed when a request head is not complete within the
    budget's head deadline. Everything else is the handler's."""

    def __init__(self, inner: asyncio.Protocol, budget: ConnectionBudget) -> None:
        self._inner = inner
        self._budget = budget
        self._transport: asyncio.BaseTransport | None = None
        self._client = ""
        self._admitted = False
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._client = _client_of(transport)
        if not self._budget.admit(self._client):
            if isinstance(transport, asyncio.WriteTransport):
                transport.abort()
            else:
                transport.close()
            return
        self._admitted = True
        self._transport = transport
        self._arm()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self._busy and self._timer is None:
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._admitted:
            return
        self._admitted = False
        self._budget.release(self._client)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def request_started(self) -> None:
        """A request head is complete: no deadline while its handler runs."""
        self._busy = True
        self._disarm()

    def request_finished(self) -> None:
        """Its handler is done: the next head's deadline starts with its first byte."""
        self._busy = False

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._budget.head_deadline_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if self._busy or transport is None or transport.is_closing():
            return
        self._budget.cut += 1
        log.debug(
            "closed the connection of %s: no complete request head within %.0f s",
            self._client,
            self._budget.head_deadline_s,
        )
        transport.close()


def guarded(
    factory: Callable[[], asyncio.Protocol], budget: ConnectionBudget
) -> Callable[[], ConnectionGuard]:
    """A protocol factory whose connections are `factory`'s behind a ConnectionGuard."""
    return lambda: ConnectionGuard(factory(), budget)


def _guard_of(request: web.Request) -> ConnectionGuard | None:
    transport = request.transport
    protocol = None if transport is None else transport.get_protocol()
    return protocol if isinstance(protocol, ConnectionGuard) else None


@web.middleware
async def head_deadline_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection's guard that a request head is complete, and when its handler is
    done (no deadline runs while a request is handled: its body has its own, node.limits)."""
    guard = _guard_of(request)
    if guard is None:
        return await handler(request)
    guard.request_started()
    try:
        return await handler(request)
    finally:
        guard.request_finished()


class Listening:
    """What a site's `_server` is to aiohttp and the daemon: its listening sockets, and
    `close()` (of the asyncio servers accepting on them, or else of the sockets)."""

    def __init__(
        self, sockets: list[socket.socket], servers: list[asyncio.Server] | None = None
    ) -> None:
        self.sockets = sockets
        self.servers = servers or []

    def close(self) -> None:
        for server in self.servers:
            server.close()
        if not self.servers:
            for sock in self.sockets:
                sock.close()


def listening_name(sockets: list[socket.socket], tls: bool = False) -> str:
    """The URL of the first of `sockets` (a site's name)."""
    host, port = sockets[0].getsockname()[:2]
    return peer_url(str(host), int(port), tls=tls)


class GuardedSite(web.BaseSite):
    """Plain HTTP on the bound `sockets` (node.startup.listen_sockets) whose connections go
    through ConnectionGuards of `budget`."""

    settle_turns = 2
    """Loop turns a stopping site waits, once it stops accepting, for the connections accepted
    in its last turn to reach aiohttp (one turn attaches the transport, one runs
    connection_made)."""

    def __init__(
        self, runner: web.BaseRunner, sockets: list[socket.socket], budget: ConnectionBudget
    ) -> None:
        super().__init__(runner)
        self._sockets = sockets
        self.budget = budget

    @property
    def name(self) -> str:
        return listening_name(self._sockets)

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        servers = [
            await loop.create_server(guarded(server, self.budget), sock=sock)
            for sock in self._sockets
        ]
        self._server = Listening(self._sockets, servers)  # type: ignore[assignment]

    async def stop(self) -> None:
        """Stop accepting, let the connections already accepted reach aiohttp (so its shutdown
        closes them), then close the listener. Closing it at once would strand a connection
        whose accept ran in the same loop turn: Python 3.11 then fails to attach its transport
        to the closed server and leaks the socket."""
        if self._server is not None:
            loop = asyncio.get_running_loop()
            for sock in self._sockets:
                loop.remove_reader(sock.fileno())
            for _ in range(self.settle_turns):
                await asyncio.sleep(0)
        await super().stop()
