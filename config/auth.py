"""The cluster secret and request signing: sign, verify, and an aiohttp client middleware.

Signature = lowercase hex HMAC-SHA256(secret, message), sent as X-Shoal-Node, X-Shoal-Timestamp,
X-Shoal-Nonce, X-Shoal-Signature. The message binds the request to the node it is sent to: a
first line `shoal-request-v2`, then METHOD, path with query, timestamp, nonce, sha256_hex(body),
and the values of X-Shoal-Node, X-Shoal-Target (the receiver's node id), X-Shoal-Cluster,
X-Shoal-Fence and X-Shoal-Forwarded (empty when absent), joined by \\n. A request without
X-Shoal-Target is of the previous release (v1: the five lines from METHOD to the body's hash),
which a node accepts only from its own host or from a member of the previous release
(docs/signing.md). A client learns a peer's node id from its 401 (X-Shoal-Receiver), and that a
peer is of the previous release from an answer without X-Shoal-Version (SigningTargets).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from config.errors import AuthError, ConfigError
from config.private import shared_file_problem

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
HEADER_TARGET = "X-Shoal-Target"
"""The node id a request is signed for; a node refuses a request signed for another (401)."""
HEADER_RECEIVER = "X-Shoal-Receiver"
"""On a 401 for a request signed for another node (or for none): the receiver's node id."""
HEADER_FENCE = "X-Shoal-Fence"
"""The plan's fence a node's work-plane call carries (node.plan)."""
HEADER_FORWARDED = "X-Shoal-Forwarded"
"""The node that forwarded an operator's call (to the coordinator, or to the node it names)."""
HEADER_VERSION_ANSWER = "X-Shoal-Version"
"""Sent on every answer of a node of this release (config.version.HEADER_VERSION)."""
BOUND_HEADERS = (HEADER_NODE, HEADER_TARGET, HEADER_CLUSTER, HEADER_FENCE, HEADER_FORWARDED)
"""The headers a v2 signature covers, in the order of its message."""
SIGNATURE_V2 = "shoal-request-v2"
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
    shared = shared_file_problem(path, mode, what)
    if shared is not None:
        raise ConfigError(shared)
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{path}: {what} is too short ({len(data)} bytes, need {MIN_SECRET_BYTES}); "
            "make one with: head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE"
        )
    return data


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _header(headers: Mapping[str, str], name: str) -> str:
    """The value of header `name` in `headers` whatever its case ("" when absent)."""
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), "")
    return value


def sign_request(
    secret: bytes,
    method: str,
    path_qs: str,
    timestamp: str,
    nonce: str,
    body: bytes,
    bound: Mapping[str, str] | None = None,
) -> str:
    """The signature of one request (lowercase hex): over the v2 message binding the values of
    BOUND_HEADERS in `bound` (the request's headers), or the previous release's v1 message
    when `bound` is None."""
    lines = [method.upper(), path_qs, timestamp, nonce, body_digest(body)]
    if bound is not None:
        lines = [SIGNATURE_V2, *lines, *(_header(bound, name) for name in BOUND_HEADERS)]
    message = "\n".join(lines)
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    secret: bytes,
    node_id: str,
    method: str,
    path_qs: str,
    body: bytes = b"",
    now: float | None = None,
    cluster: str | None = None,
    *,
    target: str | None = "",
    headers: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The authentication headers of a request signed for node `target` ("": for no node yet,
    which a node answers 401 naming itself; None: the previous release's v1 signature, bound
    to no node), X-Shoal-Cluster when `cluster`; the signature also covers the X-Shoal-Fence
    and X-Shoal-Forwarded of `headers`, the request's other headers."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(16)
    signed = {HEADER_NODE: node_id, HEADER_TIMESTAMP: timestamp, HEADER_NONCE: nonce}
    if cluster:
        signed[HEADER_CLUSTER] = cluster
    bound = None
    if target is not None:
        signed[HEADER_TARGET] = target
        bound = {**(headers or {}), **signed}
    signed[HEADER_SIGNATURE] = sign_request(secret, method, path_qs, timestamp, nonce, body, bound)
    return signed


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
    bound = headers if HEADER_TARGET in headers else None
    expected = sign_request(secret, method, path_qs, timestamp, nonce, body, bound)
    if not hmac.compare_digest(expected, signature.lower()):
        raise AuthError("bad signature")
    if not nonces.check_and_add(nonce, now):
        raise AuthError("nonce seen before (replayed request)")
    return node


MAX_PEERS_REMEMBERED = 4096
"""Peers a SigningTargets remembers; beyond, the first learnt is forgotten (and learnt again)."""


class SigningTargets:
    """What a signer knows of each peer (a base URL or host:port): the node id it answered, to
    sign for, or that it is of the previous release (sign v1, bound to no node). A peer not met
    yet is signed for "" and answers 401 naming itself; `learn` says when to sign again."""

    def __init__(self) -> None:
        self._known: OrderedDict[str, str | None] = OrderedDict()

    def target_for(self, peer: str) -> str | None:
        """The target to sign a request to `peer` for: its node id, "" when not known yet,
        None for a peer of the previous release (a v1 signature)."""
        return self._known.get(peer, "")

    def learn(
        self, peer: str, signed_for: str | None, status: int, headers: Mapping[str, str]
    ) -> bool:
        """Note what `peer`'s answer to a request signed for `signed_for` (None: v1) says of
        it; True when that request should be signed again: a 401 naming the receiver
        (X-Shoal-Receiver) another than the one signed for, or a 401 without X-Shoal-Version
        (nor a clock skew) to a v2 signature (a peer of the previous release, which checks
        the v1 message)."""
        if status != 401:
            return False
        receiver = headers.get(HEADER_RECEIVER)
        if receiver and receiver != signed_for:
            self._remember(peer, receiver)
            return True
        legacy = HEADER_VERSION_ANSWER not in headers and HEADER_CLOCK_SKEW not in headers
        if not receiver and signed_for is not None and legacy:
            self._remember(peer, None)
            return True
        return False

    def _remember(self, peer: str, target: str | None) -> None:
        self._known[peer] = target
        self._known.move_to_end(peer)
        while len(self._known) > MAX_PEERS_REMEMBERED:
            self._known.popitem(last=False)


def signing_middleware(
    secret: bytes,
    node_id: str,
    clock: Callable[[], float] = time.time,
    *,
    cluster: str | None = None,
) -> ClientMiddlewareType:
    """An aiohttp client middleware that signs every request of a ClientSession for the node it
    goes to (learnt from its first answer: SigningTargets, a request signed again once) and
    names `cluster` (this node's cluster id) in X-Shoal-Cluster when given."""
    targets = SigningTargets()

    async def middleware(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        payload = request.body
        body = payload if isinstance(payload, bytes) else await payload.as_bytes()
        peer = f"{request.url.host}:{request.url.port}"
        for attempt in range(2):
            request.headers.pop(HEADER_TARGET, None)
            target = targets.target_for(peer)
            headers = signed_headers(
                secret, node_id, request.method, request.url.raw_path_qs, body, clock(),
                cluster, target=target, headers=request.headers,
            )  # fmt: skip
            request.headers.update(headers)
            response = await handler(request)
            if attempt or not targets.learn(peer, target, response.status, response.headers):
                break
            response.release()
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
