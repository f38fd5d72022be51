"""Exceptions of the peer client, and the one table that maps failures of a peer request to them.

NetError -- base of every error the net package raises; exit code 1 from a command
 +-- ClientClosedError -- a request through a client (or transport) already closed
 +-- PeerRequestError -- a request to a peer failed; carries status (None: no answer) and code
      +-- RetryLater -- a 429 or 503 with Retry-After: the same request may succeed later
      +-- PeerTimeoutError (also TimeoutError) -- no answer in time

`map_peer_errors` is the only place that turns aiohttp's errors, urllib's, the OS's, timeouts and
bad JSON into these; `answer_error` turns a node's error answer (`{"error", "reason", "status"}`,
config.ErrorAnswer) into them. Importing this module stays light: aiohttp is imported by the
table only when it maps an error.
"""

from __future__ import annotations

import email.utils
import errno
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from config.wire import ErrorAnswer, read_error

__all__ = [
    "MAX_RETRY_AFTER_S",
    "ClientClosedError",
    "NetError",
    "PeerRequestError",
    "PeerTimeoutError",
    "RetryLater",
    "answer_error",
    "map_peer_errors",
    "parse_retry_after",
    "peer_error",
]

MAX_RETRY_AFTER_S = 60.0
"""The longest wait a Retry-After may ask for; a longer one is cut to this."""


def _restore(cls: type[NetError], message: str, state: dict[str, Any]) -> NetError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class NetError(Exception):
    """Base of every error the net package raises."""

    command_exit_code = 1
    """What a `shoal` command exits with when this error stops it."""

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only state survives a pickle (a task result, a worker's answer)
        return (_restore, (type(self), str(self), dict(self.__dict__)))


class ClientClosedError(NetError):
    """A request through a peer client (or its transport) after `close()`; make a new one."""


class PeerRequestError(NetError):
    """A request to `url` failed: no answer (`status` None) or an error answer, whose `reason`
    is the node's own words and `code` its error code."""

    def __init__(
        self, url: str, reason: str, status: int | None = None, *, code: str | None = None
    ) -> None:
        self.url = url
        self.reason = reason
        self.status = status
        self.code = code
        where = url if status is None else f"{url}: HTTP {status}"
        super().__init__(f"{where}: {reason}" + (f" ({code})" if code else ""))

    @classmethod
    def from_answer(cls, url: str, answer: ErrorAnswer) -> PeerRequestError:
        """The error of a node's error answer (config.read_error)."""
        return cls(url, answer.reason, answer.status, code=answer.code)


class RetryLater(PeerRequestError):
    """A node answered 429 or 503 with Retry-After: the same request may succeed after
    `retry_after_s` seconds (backpressure, a full queue)."""

    def __init__(
        self, url: str, reason: str, status: int, retry_after_s: float, *, code: str | None = None
    ) -> None:
        super().__init__(url, reason, status, code=code)
        self.retry_after_s = retry_after_s


class PeerTimeoutError(PeerRequestError, TimeoutError):
    """A request to `url` got no answer in time."""


# --- the table ------------------------------------------------------------------------------------


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), at most
    MAX_RETRY_AFTER_S; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def answer_error(
    url: str, status: int, body: bytes | str, headers: Mapping[str, str] | None = None
) -> PeerRequestError:
    """The error of a node's error answer (`status` >= 400): RetryLater for a 429 or 503 that
    says when to come back, else PeerRequestError with the node's reason and code."""
    answer = read_error(status, body)
    wait_s = parse_retry_after((headers or {}).get("Retry-After"))
    if status in (429, 503) and wait_s is not None:
        return RetryLater(url, answer.reason, status, wait_s, code=answer.code)
    return PeerRequestError.from_answer(url, answer)


def _loaded(name: str) -> Any:
    """Module `name` if something imported it, else None: an error of aiohttp (or asyncio) can
    exist only once it is loaded, so telling errors apart never imports it (a training process
    or a command on urllib stays light, even when a request fails)."""
    return sys.modules.get(name)


def _unreachable(exc: BaseException) -> str:
    """`unreachable: WHY` in words (never a traceback) for a connection that failed."""
    aiohttp = _loaded("aiohttp")
    if aiohttp is not None:
        if isinstance(exc, aiohttp.ClientConnectorDNSError):
            return "unreachable: cannot resolve host"
        if isinstance(exc, aiohttp.ClientConnectorError):
            exc = exc.os_error
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            return "unreachable: server disconnected"
    if isinstance(exc, OSError):
        if exc.errno == errno.ECONNREFUSED:
            return "unreachable: connection refused"
        text = exc.strerror or str(exc) or type(exc).__name__
        return f"unreachable: {text[:1].lower()}{text[1:]}"
    return f"unreachable: {exc or type(exc).__name__}"


def peer_error(
    exc: BaseException, url: str, timeout_s: float | None = None
) -> NetError | BaseException:
    """The error a failure `exc` of a request to `url` becomes (the caller chains it): a
    NetError for what the table knows, `exc` itself for anything else (a bug stays a bug)."""
    import urllib.error

    from multidict import CIMultiDict

    aiohttp, asyncio = _loaded("aiohttp"), _loaded("asyncio")
    if isinstance(exc, NetError):
        return exc
    in_s = "" if timeout_s is None else f" in {timeout_s:g} s"
    if isinstance(exc, TimeoutError) or (
        aiohttp is not None and isinstance(exc, aiohttp.ServerTimeoutError)
    ):
        return PeerTimeoutError(url, f"no answer{in_s} (timed out)")
    if isinstance(exc, urllib.error.HTTPError):
        headers = CIMultiDict(exc.headers.items() if exc.headers else ())
        return answer_error(url, exc.code, exc.read() if exc.fp else b"", headers)
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return PeerTimeoutError(url, f"no answer{in_s} (timed out)")
        return PeerRequestError(url, _unreachable(reason if isinstance(reason, OSError) else exc))
    if aiohttp is not None and isinstance(exc, aiohttp.ClientResponseError):
        return PeerRequestError(url, exc.message, exc.status)
    if aiohttp is not None and isinstance(exc, aiohttp.ClientPayloadError):
        return PeerRequestError(url, f"answer cut short: {exc}")
    if asyncio is not None and isinstance(exc, asyncio.IncompleteReadError):
        got, wanted = len(exc.partial), exc.expected
        return PeerRequestError(url, f"answer cut short: {got} of {wanted} bytes")
    if isinstance(exc, OSError) or (aiohttp is not None and isinstance(exc, aiohttp.ClientError)):
        return PeerRequestError(url, _unreachable(exc))
    if isinstance(exc, ValueError):  # json.JSONDecodeError, orjson.JSONDecodeError
        return PeerRequestError(url, f"not a JSON answer: {exc}")
    return exc


@contextmanager
def map_peer_errors(url: str, timeout_s: float | None = None) -> Iterator[None]:
    """Inside the block, a failure of a request to `url` is raised as PeerRequestError (no
    answer, a broken connection, an answer that is not JSON) or PeerTimeoutError (no answer
    within `timeout_s`), chained to the original. A NetError raised inside (answer_error's)
    passes unchanged; so does anything the table does not know."""
    try:
        yield
    except Exception as exc:
        mapped = peer_error(exc, url, timeout_s)
        if mapped is exc:
            raise
        raise mapped from exc
