"""TLS off the daemon's event loop: worker threads, each running its own asyncio loop, do the
handshake and all encryption of the API's TLS connections (asyncio's own TLS, with the server
context of the moment: TLS 1.3 and the certificate checks are unchanged). Each connection's
plain HTTP reaches the daemon's loop over a socket pair, behind a transport that says what the
TLS connection is: the client's address, its certificate, the cipher (`TlsView`).

OpenSSL releases the GIL while it encrypts and while the kernel copies, so a large file sent
over TLS no longer holds the daemon's loop for all of its encryption: the loop reads the file
and writes plain bytes into the pair, and a worker encrypts them (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from health import CheckResult, HealthStatus

__all__ = [
    "PAIR_BUFFER_BYTES",
    "TlsConnection",
    "TlsFacts",
    "TlsView",
    "TlsWorkers",
    "terminated",
]

log = logging.getLogger(__name__)

PAIR_BUFFER_BYTES = 4 * 1024 * 1024
"""Socket buffers of each connection's socket pair (the kernel's default, about 200 KiB, makes
the loop and the worker take turns every few records)."""
TLS_WRITE_HIGH_BYTES = 4 * 1024 * 1024
"""Write buffer of each side before the other side's reading pauses."""
STOP_WAIT_S = 5.0
HAND_OVER_S = 5.0
"""How much longer than the handshake's own timeout a connection waits for its worker to answer
(a worker whose loop no longer runs: its health check says so)."""
DRAIN_TURNS = 64
"""Loop turns a stopping worker waits for its aborted transports to close their sockets."""


@dataclass(frozen=True, slots=True)
class TlsFacts:
    """What the routes read of a TLS connection, taken once after its handshake (in the worker,
    so the daemon's thread never touches an SSL object another thread uses): it answers as an
    ssl.SSLObject does."""

    der: bytes | None
    decoded: dict[str, object]
    suite: tuple[str, str, int] | None
    protocol: str | None
    alpn: str | None

    @classmethod
    def of(cls, ssl_object: ssl.SSLObject | None) -> TlsFacts:
        if ssl_object is None:
            return cls(None, {}, None, None, None)
        return cls(
            der=ssl_object.getpeercert(binary_form=True),
            decoded=dict(ssl_object.getpeercert() or {}),
            suite=ssl_object.cipher(),
            protocol=ssl_object.version(),
            alpn=ssl_object.selected_alpn_protocol(),
        )

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self.der if binary_form else self.decoded

    def cipher(self) -> tuple[str, str, int] | None:
        return self.suite

    def version(self) -> str | None:
        return self.protocol

    def selected_alpn_protocol(self) -> str | None:
        return self.alpn


@dataclass(frozen=True, slots=True)
class TlsConnection:
    """A TLS connection a worker terminated, as its daemon-side transport describes it."""

    peername: object
    sockname: object
    context: ssl.SSLContext
    facts: TlsFacts

    def answer(self, name: str) -> tuple[bool, object]:
        """(True, the value) of a transport's extra info `name` this connection answers."""
        values: dict[str, object] = {
            "peername": self.peername,
            "sockname": self.sockname,
            "sslcontext": self.context,
            "ssl_object": self.facts,
            "peercert": self.facts.decoded,
            "cipher": self.facts.suite,
            "compression": None,
        }
        return (name in values, values.get(name))


class TlsView(asyncio.Transport):
    """The daemon's transport of a connection a worker terminates: the socket pair's own
    transport, except that `get_extra_info` answers for the TLS connection (peername, sockname,
    sslcontext, ssl_object, peercert, cipher) and `get_protocol` names the protocol that serves
    it."""

    def __init__(
        self, transport: asyncio.Transport, protocol: asyncio.BaseProtocol, tls: TlsConnection
    ) -> None:
        super().__init__()
        self._transport = transport
        self._protocol = protocol
        self._tls = tls

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        known, value = self._tls.answer(name)
        return value if known else self._transport.get_extra_info(name, default)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def write(self, data: Any) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()


class _Viewed(asyncio.Protocol):
    """The socket pair's protocol on the daemon's loop: hands `inner` a TlsView, then passes
    every event on to the view's protocol."""

    def __init__(self, inner: asyncio.Protocol, tls: TlsConnection) -> None:
        self._inner = inner
        self._tls = tls
        self._view: TlsView | None = None

    def _protocol(self) -> asyncio.Protocol:
        protocol = self._inner if self._view is None else self._view.get_protocol()
        assert isinstance(protocol, asyncio.Protocol)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._view = TlsView(transport, self._inner, self._tls)
        self._inner.connection_made(self._view)

    def data_received(self, data: bytes) -> None:
        self._protocol().data_received(data)

    def eof_received(self) -> bool | None:
        return self._protocol().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol().connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol().pause_writing()

    def resume_writing(self) -> None:
        self._protocol().resume_writing()


def terminated(
    factory: Callable[[], asyncio.Protocol], tls: TlsConnection
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for the daemon's end of a socket pair: `factory`'s protocol, seeing
    the TLS connection `tls`."""
    return lambda: _Viewed(factory(), tls)


def _close(transport: asyncio.Transport) -> None:
    """Close `transport` once: a second close() of asyncio's TLS transport detaches it from its
    connection, and a later abort() (a worker stopping) would then leave the socket open."""
    if not transport.is_closing():
        transport.close()


class _Relay(asyncio.Protocol):
    """One end of a worker's relay: what it receives is written to `peer`'s transport, and
    each side's flow control and end reach the other."""

    def __init__(self, live: set[asyncio.Transport]) -> None:
        self.peer: _Relay | None = None
        self.transport: asyncio.Transport | None = None
        self._live = live

    def _other(self) -> asyncio.Transport | None:
        return None if self.peer is None else self.peer.transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._live.add(transport)

    def data_received(self, data: bytes) -> None:
        other = self._other()
        if other is not None and not other.is_closing():
            other.write(data)

    def eof_received(self) -> bool | None:
        other = self._other()
        if other is None:
            return None
        if other.can_write_eof():
            other.write_eof()  # the client's end: the daemon reads to it (TLS then closes)
        else:
            _close(other)  # the daemon's end: the TLS side flushes, says close_notify, closes
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self._live.discard(self.transport)
        other = self._other()
        if other is not None:
            if exc is None:
                _close(other)
            else:
                other.abort()

    def pause_writing(self) -> None:
        other = self._other()
        if other is not None:
            other.pause_reading()

    def resume_writing(self) -> None:
        other = self._other()
        if other is not None and not other.is_closing():
            other.resume_reading()


def _connection(transport: asyncio.BaseTransport, context: ssl.SSLContext) -> TlsConnection:
    return TlsConnection(
        peername=transport.get_extra_info("peername"),
        sockname=transport.get_extra_info("sockname"),
        context=context,
        facts=TlsFacts.of(transport.get_extra_info("ssl_object")),
    )


async def _relay(
    conn: socket.socket,
    pair: socket.socket,
    context: ssl.SSLContext,
    timeout_s: float,
    live: set[asyncio.Transport],
) -> TlsConnection:
    """In a worker's loop: `pair`'s end of the relay, then the handshake on `conn`; the TLS
    connection's facts. Both sockets are closed when this fails or is cancelled."""
    loop = asyncio.get_running_loop()
    secure, plain = _Relay(live), _Relay(live)
    secure.peer, plain.peer = plain, secure
    try:
        await loop.connect_accepted_socket(lambda: plain, pair)
        transport, _ = await loop.connect_accepted_socket(
            lambda: secure, conn, ssl=context, ssl_handshake_timeout=timeout_s
        )
    except BaseException:
        if plain.transport is not None:
            plain.transport.abort()
        pair.close()
        conn.close()
        raise
    assert isinstance(transport, asyncio.Transport)
    transport.set_write_buffer_limits(high=TLS_WRITE_HIGH_BYTES)
    assert plain.transport is not None
    plain.transport.set_write_buffer_limits(high=TLS_WRITE_HIGH_BYTES)
    return _connection(transport, context)


class _Worker:
    """One thread running one asyncio loop, and the relays' transports on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.live: set[asyncio.Transport] = set()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _drain(self) -> None:
        """Cancel the handshakes under way (each closes its sockets), abort every relay, and
        wait until each transport has closed its socket."""
        this = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not this]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for transport in list(self.live):
            transport.abort()
        for _ in range(DRAIN_TURNS):  # each abort closes its socket a turn or two later
            await asyncio.sleep(0)
            if not self.live:
                break
        for _ in range(3):  # and the SSL transports' own connection_lost calls, a turn later
            await asyncio.sleep(0)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        try:
            drained = asyncio.run_coroutine_threadsafe(self._drain(), self.loop)
        except RuntimeError:  # its loop is closing already
            drained = None
        if drained is not None:
            with contextlib.suppress(Exception):
                drained.result(STOP_WAIT_S)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(STOP_WAIT_S)
        if self.thread.is_alive():
            log.warning("TLS worker %s did not stop within %.0f s", self.thread.name, STOP_WAIT_S)


class TlsWorkers:
    """`count` worker threads that terminate TLS connections, taken in turn."""

    def __init__(self, count: int, name: str = "tls", hand_over_s: float = HAND_OVER_S) -> None:
        if count < 1:
            raise ValueError(f"TLS workers: count must be at least 1, got {count}")
        self.count = count
        self._name = name
        self._hand_over_s = hand_over_s
        self._workers: list[_Worker] = []
        self._turn = itertools.count()
        self.terminated = 0
        """Connections whose handshake a worker completed (the daemon's loop did none)."""

    def start(self) -> None:
        if not self._workers:
            self._workers = [_Worker(f"{self._name}-{index}") for index in range(self.count)]

    def stop(self) -> None:
        """Abort every connection the workers hold and end their threads."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()

    @property
    def threads(self) -> list[threading.Thread]:
        return [worker.thread for worker in self._workers]

    async def check(self) -> CheckResult:
        """Unhealthy while a worker's thread or loop no longer runs (its connections would wait
        for a handshake that never comes)."""
        stopped = [
            worker.thread.name
            for worker in self._workers
            if not worker.thread.is_alive() or not worker.loop.is_running()
        ]
        metrics = {
            "workers": float(len(self._workers)),
            "connections": float(sum(len(worker.live) for worker in self._workers) // 2),
            "terminated": float(self.terminated),
        }
        if stopped:
            return CheckResult(
                HealthStatus.UNHEALTHY,
                f"TLS workers stopped: {', '.join(stopped)}; restart the node",
                metrics,
            )
        return CheckResult(HealthStatus.HEALTHY, f"{len(self._workers)} TLS workers", metrics)

    async def terminate(
        self, conn: socket.socket, context: ssl.SSLContext, timeout_s: float
    ) -> tuple[socket.socket, TlsConnection]:
        """Hand `conn` (a TLS ClientHello waiting) to a worker, which owns it from now on:
        its handshake there (TimeoutError, ssl.SSLError or OSError when it fails), then the
        daemon's end of the socket pair carrying the connection's plain bytes, and the facts
        for its transport (`terminated`)."""
        if not self._workers:
            conn.close()
            raise ConnectionResetError("TLS workers are stopped")
        worker = self._workers[next(self._turn) % len(self._workers)]
        ours, theirs = socket.socketpair()
        for end in (ours, theirs):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PAIR_BUFFER_BYTES)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PAIR_BUFFER_BYTES)
            end.setblocking(False)
        relay = _relay(conn, theirs, context, timeout_s, worker.live)
        try:
            future = asyncio.run_coroutine_threadsafe(relay, worker.loop)
        except RuntimeError:  # its loop closed under us
            relay.close()
            ours.close()
            theirs.close()
            conn.close()
            raise ConnectionResetError("TLS workers are stopped") from None
        try:
            tls = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s + self._hand_over_s)
        except BaseException:
            ours.close()
            if not worker.loop.is_running():  # nobody else holds it any more
                conn.close()
            raise
        self.terminated += 1
        return ours, tls
