"""What a peer client hands a transport and gets back: one request, its answer (whole or as a
stream), and the two transport seams (async and blocking) that a real or mock transport fills.

A request reaches a transport signed and complete: its URL is final (`encoded`, sent byte for
byte, so the signature over the path and query holds), its body is bytes.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "AsyncTransport",
    "BlockingTransport",
    "PeerRequest",
    "PeerResponse",
    "PeerStream",
    "PeerTls",
    "SslContextProvider",
]

SslContextProvider = Callable[[], ssl.SSLContext | None]
"""The TLS seam: gives the client TLS context for the next connection (None: plain http)."""

PeerTls = Callable[[str], tuple[ssl.SSLContext, str] | None]
"""The per-peer TLS seam: for a peer's `host:port` (an IPv6 host in brackets), the client TLS
context and the name its certificate must carry (`server_hostname`: a node's id), or None for
plain http. It decides the scheme of each peer's base URL and the handshake of its
connections; a node makes it from its membership (which peers serve TLS) and its certificate."""


@dataclass(frozen=True)
class PeerRequest:
    """One request: `base` the peer's base URL (scheme://host:port, the session's key),
    `path_qs` the path and query as sent and signed, the headers (signature included) and body;
    `timeout_s` bounds connecting and each read, unless `unbounded_reads` (a followed log that
    may be silent for long: only connecting is bounded)."""

    method: str
    base: str
    path_qs: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    timeout_s: float = 10.0
    unbounded_reads: bool = False
    resign: Callable[[], Mapping[str, str]] | None = field(default=None, compare=False, repr=False)
    """Fresh signature headers (a new nonce and time) for a transport that sends the request
    again by itself (aiohttp retries an idempotent request once on a dropped kept-alive
    connection): a node refuses a nonce it has seen."""
    tls: tuple[ssl.SSLContext, str] | None = field(default=None, compare=False, repr=False)
    """The client context and server_hostname of this peer's handshake (PeerTls's choice);
    None: the transport's own `ssl_context`, or the default verification of an https URL."""

    @property
    def url(self) -> str:
        return self.base + self.path_qs

    def json(self) -> Any:
        """The body as JSON (None when empty); for test handlers."""
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class PeerResponse:
    """A whole answer: status, headers (case-insensitive when the transport's are) and body."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @classmethod
    def of_json(
        cls, value: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> PeerResponse:
        """An answer whose body is `value` as JSON; for test handlers."""
        sent = {"Content-Type": "application/json", **(headers or {})}
        return cls(status, sent, json.dumps(value).encode())

    def json(self) -> Any:
        """The body as JSON; None when the body is empty. ValueError when it is not JSON."""
        return json.loads(self.body) if self.body else None


class PeerStream(Protocol):
    """An answer whose body is read piece by piece (a file, a log that follows a job)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def iter_chunks(self, size: int | None = None) -> AsyncIterator[bytes]:
        """The body in pieces of at most `size` bytes; without `size`, as received (no copy
        joins what is buffered)."""
        ...

    async def readexactly(self, size: int) -> bytes:
        """The next `size` bytes of the body; asyncio.IncompleteReadError when it ends first."""
        ...

    def iter_lines(self) -> AsyncIterator[bytes]:
        """The body line by line, each with its b"\\n" (the last one may lack it)."""
        ...

    async def read(self) -> bytes:
        """The rest of the body."""
        ...


class AsyncTransport(Protocol):
    """Sends requests of a PeerClient. `stream` opens an answer; its headers have arrived when
    the context is entered, and leaving it releases the connection."""

    def stream(self, request: PeerRequest) -> AbstractAsyncContextManager[PeerStream]: ...

    async def aclose(self) -> None:
        """Release every connection. Idempotent."""
        ...


class BlockingTransport(Protocol):
    """Sends requests of a BlockingPeerClient; `send` returns the whole answer, an error
    answer (status >= 400) included, and raises only when there was no answer."""

    def send(self, request: PeerRequest) -> PeerResponse: ...

    def close(self) -> None: ...


def iter_pieces(body: bytes, size: int) -> Iterator[bytes]:
    """`body` in pieces of at most `size` bytes."""
    for start in range(0, len(body), max(1, size)):
        yield body[start : start + max(1, size)]
