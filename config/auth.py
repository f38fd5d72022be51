"""The cluster secret and request signing: sign, verify, and an aiohttp client middleware.

Signature = lowercase hex HMAC-SHA256(secret, METHOD \\n path_with_query \\n timestamp \\n nonce
\\n sha256_hex(body)), sent as X-Shoal-Node, X-Shoal-Timestamp, X-Shoal-Nonce, X-Shoal-Signature.
A node also names its cluster id in X-Shoal-Cluster (outside the signature, so a receiver of a
release before cluster ids still verifies it; a receiver refuses another cluster's requests).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from config.errors import AuthError, ConfigError

if TYPE_CHECKING:  # aiohttp only for the middlewares' types: a blocking client never loads it
    from aiohttp import ClientHandlerType, ClientMiddlewareType, ClientRequest, ClientResponse

HEADER_NODE = "X-Shoal-Node"
HEADER_TIMESTAMP = "X-Shoal-Timestamp"
HEADER_NONCE = "X-Shoal-Nonce"
HEADER_SIGNATURE = "X-Shoal-Signature"
HEADER_CLUSTER = "X-Shoal-Cluster"
"""The sender's cluster id; a node refuses a request naming another cluster (403)."""
HEADER_CLOCK_SKEW = "X-Shoal-Clock-Skew"
"""On a 401 for a timestamp outside the window: the sender's clock minus the receiver's, in s."""
MIN_NONCE_CHARS = 16
MIN_SECRET_BYTES = 16
SKEW_SHOWN_S = 600.0
SKEW_LOG_EVERY_S = 60.0

log = logging.getLogger(__name__)


class ClockSkews:
    """Peers whose clocks are further from this node's than the signature window, as learnt
    from refused requests (either side): each is logged (at most once a minute) and listed in
    /v1/status until a request in the window succeeds or SKEW_SHOWN_S pass."""

    def __init__(self) -> None:
        self._skews: dict[str, tuple[float, float]] = {}
        self._logged: dict[str, float] = {}

    def record(self, peer: str, skew_s: float, now: float) -> None:
        """`peer`'s clock is `skew_s` ahead of this node's (behind when negative)."""
        self._skews[peer] = (skew_s, now)
        if now - self._logged.get(peer, -math.inf) >= SKEW_LOG_EVERY_S:
            self._logged[peer] = now
            log.warning("%s", self.line(peer, skew_s))

    def clear(self, peer: str) -> None:
        self._skews.pop(peer, None)

    @staticmethod
    def line(peer: str, skew_s: float) -> str:
        return f"clock skew with {peer}: {skew_s:+.0f} s; signatures refused; fix time sync"

    def lines(self, now: float) -> list[str]:
        """The current skews, one line per peer."""
        return [
            self.line(peer, skew)
            for peer, (skew, seen) in sorted(self._skews.items())
            if now - seen <= SKEW_SHOWN_S
        ]


CLOCK_SKEWS = ClockSkews()
"""This process's view (a node signs as one client and verifies as one server)."""


def read_secret_file(path: Path, what: str = "secret file") -> bytes:
    """The secret in `path`, refusing a file readable by group or others."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        data = path.read_bytes().strip()
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: {what} not found") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path}: {what} is readable by group or others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod 600 {path}"
        )
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{path}: {what} is too short ({len(data)} bytes, need {MIN_SECRET_BYTES}); "
            "make one with: head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE"
        )
    return data


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def sign_request(
    secret: bytes, method: str, path_qs: str, timestamp: str, nonce: str, body: bytes
) -> str:
    """The signature of one request (lowercase hex)."""
    message = "\n".join([method.upper(), path_qs, timestamp, nonce, body_digest(body)])
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    secret: bytes,
    node_id: str,
    method: str,
    path_qs: str,
    body: bytes = b"",
    now: float | None = None,
    cluster: str | None = None,
) -> dict[str, str]:
    """The four authentication headers for a request, and X-Shoal-Cluster when `cluster`."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(16)
    headers = {
        HEADER_NODE: node_id,
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: sign_request(secret, method, path_qs, timestamp, nonce, body),
    }
    if cluster:
        headers[HEADER_CLUSTER] = cluster
    return headers


class NonceCache:
    """Nonces seen within the accepted clock window; bounded in size."""

    def __init__(self, window_s: float = 600.0, max_entries: int = 200_000) -> None:
        self._window_s = window_s
        self._max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()

    def seen(self, nonce: str) -> bool:
        """Whether `nonce` was remembered (a replay), without remembering it."""
        return nonce in self._seen

    def check_and_add(self, nonce: str, now: float) -> bool:
        """False when `nonce` was seen before within the window; else remember it."""
        while self._seen:
            oldest, seen_at = next(iter(self._seen.items()))
            if now - seen_at <= self._window_s and len(self._seen) < self._max_entries:
                break
            del self._seen[oldest]
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


def verify_request(
    secret: bytes,
    headers: Mapping[str, str],
    method: str,
    path_qs: str,
    body: bytes,
    nonces: NonceCache,
    now: float | None = None,
    skew_s: float = 300.0,
) -> str:
    """Check a signed request and return the sender's node id; raise AuthError(reason) if not."""
    now = time.time() if now is None else now
    node = headers.get(HEADER_NODE, "")
    timestamp = headers.get(HEADER_TIMESTAMP, "")
    nonce = headers.get(HEADER_NONCE, "")
    signature = headers.get(HEADER_SIGNATURE, "")
    if not (node and timestamp and nonce and signature):
        raise AuthError("missing signature headers (X-Shoal-Node, -Timestamp, -Nonce, -Signature)")
    if len(nonce) < MIN_NONCE_CHARS or any(ch not in "0123456789abcdefABCDEF" for ch in nonce):
        raise AuthError(f"nonce must be at least {MIN_NONCE_CHARS} hex characters")
    try:
        sent_at = int(timestamp)
    except ValueError as exc:
        raise AuthError("timestamp is not unix seconds") from exc
    if abs(now - sent_at) > skew_s:
        raise AuthError(f"timestamp is {now - sent_at:+.0f} s off (limit {skew_s:.0f} s)")
    expected = sign_request(secret, method, path_qs, timestamp, nonce, body)
    if not hmac.compare_digest(expected, signature.lower()):
        raise AuthError("bad signature")
    if not nonces.check_and_add(nonce, now):
        raise AuthError("nonce seen before (replayed request)")
    return node


def signing_middleware(
    secret: bytes,
    node_id: str,
    clock: Callable[[], float] = time.time,
    *,
    cluster: str | None = None,
) -> ClientMiddlewareType:
    """An aiohttp client middleware that signs every request of a ClientSession and names
    `cluster` (this node's cluster id) in X-Shoal-Cluster when given."""

    async def middleware(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        payload = request.body
        body = payload if isinstance(payload, bytes) else await payload.as_bytes()
        headers = signed_headers(
            secret, node_id, request.method, request.url.raw_path_qs, body, clock(), cluster
        )
        request.headers.update(headers)
        response = await handler(request)
        peer = f"{request.url.host}:{request.url.port}"
        skew = response.headers.get(HEADER_CLOCK_SKEW)
        if response.status == 401 and skew is not None:
            with contextlib.suppress(ValueError):  # the sender's (our) clock minus the peer's
                CLOCK_SKEWS.record(peer, -float(skew), clock())
        elif response.status != 401:
            CLOCK_SKEWS.clear(peer)
        return response

    return middleware


def cluster_middleware(cluster: str) -> ClientMiddlewareType:
    """An aiohttp client middleware that names `cluster` in X-Shoal-Cluster (unsigned sessions
    of a node without a secret, dev mode)."""

    async def middleware(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        request.headers[HEADER_CLUSTER] = cluster
        return await handler(request)

    return middleware


def peer_middlewares(
    secret: bytes | None, node_id: str, cluster: str | None
) -> tuple[ClientMiddlewareType, ...]:
    """The client middlewares of a node's session to its peers: signing with `secret` (when
    set) and the X-Shoal-Cluster header naming `cluster` (when set)."""
    if secret is not None:
        return (signing_middleware(secret, node_id, cluster=cluster),)
    return (cluster_middleware(cluster),) if cluster else ()
