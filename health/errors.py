"""Exceptions of health, and the table giving failed requests of the monitor their words.

HealthError -- base of every error the health package raises
 +-- HealthConfigError (also ValueError) -- a threshold, breaker config or check is invalid
 +-- CircuitOpenError -- a breaker refused a call; carries retry_after_s
 +-- MonitorError -- cluster_monitor could not do what was asked (bad targets, closed monitor)
      +-- UsageError -- a bad flag or value on the command line (exit status 2)
      +-- FetchError -- one request to one node failed; `reason` is what its row shows
           +-- FetchTimeoutError (also TimeoutError) -- no answer within the timeout
"""

from __future__ import annotations

import errno

from config import read_error
from net.errors import PeerRequestError, PeerTimeoutError

__all__ = [
    "CircuitOpenError",
    "FetchError",
    "FetchTimeoutError",
    "HealthConfigError",
    "HealthError",
    "MonitorError",
    "UsageError",
    "describe_fetch_error",
    "fetch_error",
    "http_fetch_error",
]


class HealthError(Exception):
    """Base of every error the health package raises."""


class HealthConfigError(HealthError, ValueError):
    """A breaker config, threshold or check registration is invalid; the message names it."""


class CircuitOpenError(HealthError):
    """The breaker `name` refuses calls; retry in `retry_after_s` seconds."""

    def __init__(self, name: str, retry_after_s: float, reason: str = "open") -> None:
        self.name = name
        self.retry_after_s = max(0.0, retry_after_s)
        self.reason = reason
        super().__init__(
            f"circuit {name!r} is {reason}; calls are refused, retry in {self.retry_after_s:.1f} s"
        )

    def __reduce__(self) -> tuple[type[CircuitOpenError], tuple[str, float, str]]:
        return (type(self), (self.name, self.retry_after_s, self.reason))


class MonitorError(HealthError):
    """cluster_monitor could not do what was asked (bad targets, a closed monitor)."""


class UsageError(MonitorError):
    """A bad flag or value on the command line (exit status 2)."""


class FetchError(MonitorError):
    """One request to one node failed; `reason` is what its row shows."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class FetchTimeoutError(FetchError, TimeoutError):
    """A request to a node got no answer within the timeout."""


def describe_fetch_error(exc: BaseException, timeout_s: float) -> str:
    """The one-line reason a row shows for a failed request (never a traceback)."""
    if isinstance(exc, TimeoutError):
        return f"timeout after {float(timeout_s)} s"
    import aiohttp  # here: `cluster_monitor --once` asks over urllib and never loads it

    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "unreachable: cannot resolve host"
    if isinstance(exc, aiohttp.ClientConnectorError):
        code = exc.os_error.errno
        if code == errno.ECONNREFUSED:
            return "unreachable: connection refused"
        text = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
        return f"unreachable: {text.lower()}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "unreachable: server disconnected"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return f"unreachable: {exc or type(exc).__name__}"
    return f"error: {exc or type(exc).__name__}"


def fetch_error(exc: BaseException, timeout_s: float) -> FetchError:
    """The FetchError for a failed request (the caller chains it): net's PeerRequestError (an
    error answer reads `STATUS: reason`), or an error of aiohttp or the OS; a timeout is
    FetchTimeoutError."""
    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, PeerTimeoutError):
        return FetchTimeoutError(describe_fetch_error(exc, timeout_s))
    if isinstance(exc, PeerRequestError):
        if exc.status is not None:
            return FetchError(f"{exc.status}: {exc.reason or 'no reason'}")
        return FetchError(exc.reason)
    reason = describe_fetch_error(exc, timeout_s)
    return FetchTimeoutError(reason) if isinstance(exc, TimeoutError) else FetchError(reason)


def http_fetch_error(status: int, body: bytes) -> FetchError:
    """The FetchError of a node's error answer: `STATUS: reason` in the node's own words."""
    return FetchError(f"{status}: {read_error(status, body).reason or 'no reason'}")
