"""Budgets of what a caller can make a node do before it is known: body reads with deadlines and
permits per client (a signed request's body is read before its signature can be checked), and
the small, capped reads of the one unauthenticated POST (the dashboard's login).

Every limit here is documented in docs/security.md (a test compares the page with these)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from config import error_response
from node.errors import BodyRefused as BodyRefused

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body a node reads (the app's client_max_size)."""
SMALL_BODY_BYTES = 1024 * 1024
"""Bodies up to this size (a vote, a heartbeat, a job start) are read with the small permits;
larger ones, and chunked bodies of unknown size, with the large permits."""
MAX_SMALL_BODY_READS = 32
MAX_SMALL_BODY_READS_PER_CLIENT = 8
MAX_LARGE_BODY_READS = 4
MAX_LARGE_BODY_READS_PER_CLIENT = 2
"""Bodies of not yet verified requests read at once: in all, and from one client address (so
one client cannot take every permit, and a heartbeat never waits behind a file)."""
BODY_PERMIT_WAIT_S = 10.0
"""How long a request waits for a permit before it is answered 503 (Retry-After)."""
BODY_READ_BASE_S = 10.0
BODY_READ_MIN_BYTES_PER_S = 1024 * 1024
"""A body must arrive within BODY_READ_BASE_S + its size at BODY_READ_MIN_BYTES_PER_S (a
chunked body: as for MAX_BODY_BYTES), else 408 and the connection is closed."""
LOGIN_MAX_BYTES = 4096
"""The largest body of POST /ui/login (a form with the read token); no Content-Encoding."""
MAX_LOGINS = 4
"""Logins read at once; more are answered 503 at once."""
LOGIN_READ_S = 5.0
"""A login's body must arrive within this time."""


def _refusal(
    status: int, code: str, reason: str, retry_after_s: float | None = None
) -> BodyRefused:
    answer = error_response(status, reason, code, retry_after_s=retry_after_s)
    return BodyRefused(answer, close=status != 503)


async def refused_answer(request: web.Request, refused: BodyRefused) -> web.StreamResponse:
    """The answer of `refused`, sent; with `close`, the connection is then closed at once
    rather than read to the end of its body (aiohttp would read and inflate what is left for
    up to its lingering time: the CPU a gzip bomb or a 60 MiB post costs)."""
    if not refused.close:
        return refused.answer
    refused.answer.force_close()
    await refused.answer.prepare(request)
    await refused.answer.write_eof()
    request.protocol.force_close()
    return refused.answer


@dataclass
class BodyPermits:
    """`total` permits, at most `per_client` of them held by one client address."""

    total: int
    per_client: int
    _all: asyncio.Semaphore = field(init=False)
    _clients: dict[str, asyncio.Semaphore] = field(init=False, default_factory=dict)
    _users: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._all = asyncio.Semaphore(self.total)

    @property
    def clients(self) -> int:
        """Client addresses holding or waiting for a permit now."""
        return len(self._users)

    @contextlib.asynccontextmanager
    async def hold(self, client: str, wait_s: float) -> AsyncIterator[None]:
        """Hold one permit for `client` (its own first, then one of all); BodyRefused 503
        when none frees within `wait_s`."""
        own = self._clients.get(client)
        if own is None:
            own = self._clients[client] = asyncio.Semaphore(self.per_client)
        self._users[client] = self._users.get(client, 0) + 1
        try:
            try:
                async with asyncio.timeout(wait_s):
                    await own.acquire()
                    try:
                        await self._all.acquire()
                    except BaseException:
                        own.release()
                        raise
            except TimeoutError:
                raise _refusal(
                    503,
                    "busy",
                    f"this node reads at most {self.total} request bodies of this size at once "
                    f"({self.per_client} per client); none freed within {wait_s:.0f} s, retry",
                    retry_after_s=1.0,
                ) from None
            try:
                yield
            finally:
                self._all.release()
                own.release()
        finally:
            left = self._users[client] - 1
            if left:
                self._users[client] = left
            else:
                del self._users[client]
                del self._clients[client]


@dataclass
class BodyBudget:
    """The permits of one node's unverified body reads: small and large bodies apart."""

    small: BodyPermits = field(
        default_factory=lambda: BodyPermits(MAX_SMALL_BODY_READS, MAX_SMALL_BODY_READS_PER_CLIENT)
    )
    large: BodyPermits = field(
        default_factory=lambda: BodyPermits(MAX_LARGE_BODY_READS, MAX_LARGE_BODY_READS_PER_CLIENT)
    )


def read_deadline_s(size_bytes: int | None) -> float:
    """How long a body of `size_bytes` (None: chunked, unknown) may take to arrive."""
    size = MAX_BODY_BYTES if size_bytes is None else size_bytes
    return BODY_READ_BASE_S + size / BODY_READ_MIN_BYTES_PER_S


def _client(request: web.Request) -> str:
    return request.remote or "unknown"


async def read_unverified_body(request: web.Request, budget: BodyBudget) -> bytes:
    """The body of a request whose signature is still to be checked: no permit for an empty
    one; else a permit of the client's (small or large by Content-Length), and the body within
    its deadline. BodyRefused (503 no permit in time, 408 too slow) otherwise."""
    if not request.body_exists:
        return b""
    size = request.content_length
    permits = budget.small if size is not None and size <= SMALL_BODY_BYTES else budget.large
    deadline_s = read_deadline_s(size)
    async with permits.hold(_client(request), BODY_PERMIT_WAIT_S):
        try:
            async with asyncio.timeout(deadline_s):
                return await request.read()
        except TimeoutError:
            log.debug("%s %s from %s: body too slow", request.method, request.path, request.remote)
            raise _refusal(
                408,
                "body_timeout",
                f"the body did not arrive within {deadline_s:.0f} s (at least "
                f"{BODY_READ_MIN_BYTES_PER_S // 1024} KiB/s after {BODY_READ_BASE_S:.0f} s)",
            ) from None


async def read_small_body(
    request: web.Request, limit: asyncio.Semaphore, max_bytes: int, deadline_s: float
) -> bytes:
    """The body of an unauthenticated request that takes only a few bytes: refused before a
    byte is read when it is encoded (415), announced larger than `max_bytes` (413) or when
    `limit` is taken (503); read within `deadline_s` (408) and never past `max_bytes` (413)."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise _refusal(
            415, "unsupported_encoding", f"Content-Encoding {encoding[:40]!r}: send it plain"
        )
    if request.content_length is not None and request.content_length > max_bytes:
        raise _refusal(413, "too_large", f"at most {max_bytes} bytes")
    if limit.locked():
        raise _refusal(503, "busy", "too many at once; retry", retry_after_s=1.0)
    async with limit:
        try:
            async with asyncio.timeout(deadline_s):
                body = await request.content.read(max_bytes + 1)
                while len(body) <= max_bytes and not request.content.at_eof():
                    more = await request.content.read(max_bytes + 1 - len(body))
                    if not more:
                        break
                    body += more
        except TimeoutError:
            raise _refusal(
                408, "body_timeout", f"the body did not arrive within {deadline_s:.0f} s"
            ) from None
    if len(body) > max_bytes:
        raise _refusal(413, "too_large", f"at most {max_bytes} bytes")
    return body
