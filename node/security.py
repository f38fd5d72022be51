"""Server side of peer authentication and the JSON error contract of the HTTP API."""

from __future__ import annotations

import contextvars
import functools
import hmac
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler

from config import (
    CLOCK_SKEWS,
    HEADER_CLOCK_SKEW,
    HEADER_CLUSTER,
    HEADER_FORWARDED,
    HEADER_NODE,
    HEADER_NONCE,
    HEADER_RECEIVER,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    MIN_NONCE_CHARS,
    AuthError,
    NonceCache,
    error_exception,
    error_response,
    is_valid_node_id,
    verify_request,
)
from node.access import is_public
from node.errors import AnsweredError, BodyRefused, SkewError, TargetError
from node.forwarding import REQUEST_FORWARDER, proven_operator
from node.limits import BodyBudget, read_unverified_body, refused_answer
from node.signers import check_target

if TYPE_CHECKING:
    from config.tls import PeerIdentity

log = logging.getLogger(__name__)

OPENAPI_PATH = "/v1/openapi.json"


SKEW_PROBE_MAX_BYTES = 1024 * 1024
"""A request refused for its timestamp is checked for a valid signature (is it a peer whose
clock is off?) only when its body is at most this large."""


CLIENT_ID_PREFIXES = ("cli-", "monitor-", "api-")
"""The sender ids of clients that are not nodes: `shoal` commands, job and lock clients and
training processes sign as `cli-...`, cluster_monitor as `monitor-HOST`, the sync API as
`api-HOST`. Every signer holds the same cluster secret, so an id is a claim, not a proof: the
check refuses a sender that names a node this node does not know, and nothing more."""
MAX_SENDER_CHARS_SHOWN = 80
MAX_CLUSTERS_NOTED = 1024
"""Foreign cluster ids (and senders naming none) logged once each; beyond this, at DEBUG only."""


REQUEST_SENDER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "shoal_request_sender", default=None
)
"""The signed sender of the request being handled (set by auth_middleware), for the audit
records its handlers write; None outside a signed request."""


def request_sender() -> str | None:
    """The sender id of the signed request this code runs for, or None (no request, or an
    unsigned one)."""
    return REQUEST_SENDER.get()


def is_client_id(sender: str) -> bool:
    """Whether `sender` names a client that is not a node (CLIENT_ID_PREFIXES)."""
    return sender.startswith(CLIENT_ID_PREFIXES)


@dataclass
class AuthPolicy:
    """The node's secret (None: dev mode, loopback only), the /metrics bearer token,
    `known_node`: whether a sender id names a node this node knows (itself, its inventory, its
    membership view; None checks no sender, as in API tests), and `cluster`: this node's
    cluster id, whose requests alone are served (None checks no cluster). `node_id`: the id a
    request must be signed for (X-Shoal-Target; None checks no target), and `unbound_ok`:
    whether a request signed as the previous release signs (no target) is served, given its
    sender and the client's address (None: always)."""

    secret: bytes | None
    metrics_token: bytes | None = None
    skew_s: float = 300.0
    known_node: Callable[[str], bool] | None = None
    cluster: str | None = None
    node_id: str | None = None
    unbound_ok: Callable[[str, str | None], bool] | None = None
    noted_clusters: set[str] = field(default_factory=set)
    nonces: NonceCache = field(default_factory=NonceCache)
    bodies: BodyBudget = field(default_factory=BodyBudget)
    """The permits of body reads before a signature is checked (node.limits)."""


AUTH_POLICY = web.AppKey("auth_policy", AuthPolicy)
PEER_ID = web.RequestKey("peer_id", str)
PEER_IDENTITY: web.RequestKey[PeerIdentity] = web.RequestKey("peer_identity")
"""The verified identity and role of the request's client certificate (node.identity); a
request that has one needs no signature."""
BROWSER_READER = web.RequestKey("browser_reader", bool)
"""Set by the dashboard's gate (node.ui) on a GET it has let through, with its session cookie
or to its public login page: such a request needs no signature."""


def json_error(status: int, reason: str, *, code: str | None = None, **extra: Any) -> web.Response:
    """An error answer in the one shape {"error": code, "reason": reason, "status": status, ...};
    `code` defaults to the status's (config.wire.STATUS_CODES)."""
    return error_response(status, reason, code, **extra)


def _bearer_ok(request: web.Request, token: bytes | None) -> bool:
    header = request.headers.get("Authorization", "")
    if token is None or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token)


async def _skewed_peer(request: web.Request, policy: AuthPolicy, skew_s: float) -> str | None:
    """The sender of a request refused for its timestamp, when its signature is otherwise valid
    (only a holder of the cluster secret can make one): a peer whose clock is off."""
    assert policy.secret is not None
    size = request.content_length
    if request.body_exists and (size is None or size > SKEW_PROBE_MAX_BYTES):
        return None
    try:
        body = await read_unverified_body(request, policy.bodies)
    except BodyRefused:
        return None
    try:
        return verify_request(
            policy.secret,
            request.headers,
            request.method,
            request.raw_path,
            body,
            NonceCache(),
            now=time.time() + skew_s,
            skew_s=policy.skew_s,
        )
    except AuthError:
        return None


def check_headers(
    policy: AuthPolicy, headers: Mapping[str, str], now: float, remote: str | None = None
) -> str:
    """The sender named by a request's signature headers, checked before its body is read:
    all four present, the nonce well-formed, the timestamp within the clock window, the sender
    known (a node of `policy.known_node`, or a client id), signed for this node (TargetError),
    the nonce unseen. Raises AuthError; the signature itself needs the body
    (verify_request)."""
    node = headers.get(HEADER_NODE, "")
    timestamp = headers.get(HEADER_TIMESTAMP, "")
    nonce = headers.get(HEADER_NONCE, "")
    if not (node and timestamp and nonce and headers.get(HEADER_SIGNATURE, "")):
        raise AuthError("missing signature headers (X-Shoal-Node, -Timestamp, -Nonce, -Signature)")
    if len(nonce) < MIN_NONCE_CHARS or any(ch not in "0123456789abcdefABCDEF" for ch in nonce):
        raise AuthError(f"nonce must be at least {MIN_NONCE_CHARS} hex characters")
    try:
        sent_at = int(timestamp)
    except ValueError as exc:
        raise AuthError("timestamp is not unix seconds") from exc
    if abs(now - sent_at) > policy.skew_s:
        raise SkewError(sent_at - now, policy.skew_s)
    known = policy.known_node
    if known is not None and not is_client_id(node) and not known(node):
        shown = node[:MAX_SENDER_CHARS_SHOWN]
        raise AuthError(
            f"unknown sender {shown!r}: no node of this node's inventory or membership view; "
            f"a client that is not a node signs as {CLIENT_ID_PREFIXES[0]}NAME"
        )
    check_target(policy.node_id, policy.unbound_ok, headers, node, remote)
    if policy.nonces.seen(nonce):
        raise AuthError("nonce seen before (replayed request)")
    return node


def _note_cluster(policy: AuthPolicy, key: str, level: int, message: str, *args: object) -> None:
    """Log `message` at `level` the first time `key` is seen, at DEBUG after that."""
    first = key not in policy.noted_clusters
    if first and len(policy.noted_clusters) < MAX_CLUSTERS_NOTED:
        policy.noted_clusters.add(key)
    log.log(level if first else logging.DEBUG, message, *args)


@web.middleware
async def foreign_cluster_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse (403) a request whose X-Shoal-Cluster names another cluster than this node's,
    before its signature is checked (another cluster's secret would only give "bad signature").
    A request naming no cluster (a client, or a node of a release before cluster ids) is
    served; this is logged at DEBUG."""
    policy = request.app[AUTH_POLICY]
    theirs = request.headers.get(HEADER_CLUSTER)
    if policy.cluster is None:
        return await handler(request)
    if theirs is None:
        _note_cluster(
            policy,
            f"none:{request.remote}",
            logging.DEBUG,
            "%s %s from %s names no cluster id; served (a client or an older release)",
            request.method,
            request.path,
            request.remote,
        )
        return await handler(request)
    if theirs == policy.cluster:
        return await handler(request)
    shown = theirs[:MAX_SENDER_CHARS_SHOWN]
    _note_cluster(
        policy,
        f"cluster:{shown}",
        logging.WARNING,
        "refused requests from %s of cluster %r: this node is of cluster %r",
        request.remote,
        shown,
        policy.cluster,
    )
    return json_error(
        403,
        f"request of cluster {shown!r} refused: this node is of cluster {policy.cluster!r}; "
        "a node serves only its own cluster (check the inventory's cluster.name)",
        code="wrong_cluster",
        cluster=policy.cluster,
        sender_cluster=shown,
    )


def _bearer_refusal(request: web.Request, policy: AuthPolicy) -> web.Response | None:
    """None when GET /metrics carries this node's metrics bearer token, else the 401."""
    if _bearer_ok(request, policy.metrics_token):
        return None
    reason = (
        "this node has no metrics token: set metrics_token_file, or sign the request"
        if policy.metrics_token is None
        else "wrong metrics bearer token: it does not match this node's metrics_token_file"
    )
    log.debug("refused GET /metrics from %s: %s", request.remote, reason)
    return json_error(401, reason, code="unauthorized")


async def _skew_refusal(request: web.Request, policy: AuthPolicy, exc: SkewError) -> web.Response:
    """The 401 of a request signed with a skewed clock: `clock_skew` (and the skew recorded)
    when its signature is otherwise good, else a plain `unauthorized`."""
    skewed = await _skewed_peer(request, policy, exc.skew_s)
    if skewed is None:
        return json_error(401, exc.reason, code="unauthorized")
    CLOCK_SKEWS.record(skewed, exc.skew_s, time.time())
    response = json_error(
        401,
        f"clock skew: your clock is {exc.skew_s:+.0f} s off this node's (limit "
        f"{policy.skew_s:.0f} s); signatures refused; fix time sync",
        code="clock_skew",
    )
    response.headers[HEADER_CLOCK_SKEW] = f"{exc.skew_s:+.0f}"
    return response


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse unsigned or badly signed requests with 401 and a JSON reason.

    The headers are checked before a byte of the body is read, so an unsigned flood costs no
    memory; only then is the body read (within the app's client_max_size, with a permit of
    the client's and a deadline: node.limits) and the signature over it checked. A call a
    node forwarded (X-Shoal-Forwarded) is then served as the operator whose proof it carries
    (node.forwarding), or as the forwarding node's own without one."""
    if HEADER_FORWARDED in request.headers:
        if request.app[AUTH_POLICY].secret is None and not request.secure:
            # no secret and no TLS: nothing authenticates here (`--insecure`)
            handler = functools.partial(_forwarded_unchecked, handler=handler)
        else:
            handler = functools.partial(_as_forwarded, handler=handler)
    return await _authenticated(request, handler)


async def _forwarded_unchecked(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Serve a forwarded `request` on a node without authentication (`--insecure`): nothing
    is proven there, but the audit says which node the call came through (`forwarded_by`)
    instead of passing it off as this node's own."""
    forwarder = request.headers[HEADER_FORWARDED]
    if not is_valid_node_id(forwarder):
        return await handler(request)
    token = REQUEST_FORWARDER.set(forwarder)
    try:
        return await handler(request)
    finally:
        REQUEST_FORWARDER.reset(token)


async def _as_forwarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Serve a forwarded `request` (authenticated) as the operator its proof names."""
    policy = request.app[AUTH_POLICY]
    identity = request.get(PEER_IDENTITY)
    forwarder = identity.name if identity is not None else request.get(PEER_ID)
    is_node = (
        identity.role.value == "node"
        if identity is not None
        else forwarder is not None and not is_client_id(forwarder)
    )
    if not is_node or forwarder is None:
        return await handler(request)  # only a node forwards; a client's header means nothing
    try:
        operator = await proven_operator(
            request,
            secret=policy.secret,
            seen=lambda nonce: not policy.nonces.check_and_add(f"proof:{nonce}", time.time()),
            skew_s=policy.skew_s,
            nonces=policy.nonces,
        )
    except AuthError as exc:
        log.warning("refused a call %s forwarded (%s %s): %s", forwarder, request.method,
                    request.path, exc)  # fmt: skip
        return json_error(403, f"forwarded call refused: {exc.reason}", code="forwarded_refused")
    if operator is None:
        return await handler(request)
    name = operator if isinstance(operator, str) else operator.name
    if not isinstance(operator, str):
        request[PEER_IDENTITY] = operator  # the role checks see the operator
    request[PEER_ID] = name
    tokens = (REQUEST_SENDER.set(name), REQUEST_FORWARDER.set(forwarder))
    try:
        return await handler(request)
    finally:
        REQUEST_FORWARDER.reset(tokens[1])
        REQUEST_SENDER.reset(tokens[0])


async def _authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
    policy = request.app[AUTH_POLICY]
    if policy.secret is None or is_public(request):
        return await handler(request)
    if request.get(BROWSER_READER, False) or PEER_IDENTITY in request:
        return await handler(request)
    if request.match_info.http_exception is not None:
        # no such route or method: the router's 404/405 says no more than the public OpenAPI
        # document does, and no body is read for it
        return await handler(request)
    if request.path == "/metrics" and request.headers.get("Authorization", "").startswith(
        "Bearer "
    ):
        refused = _bearer_refusal(request, policy)
        return refused if refused is not None else await handler(request)
    try:
        check_headers(policy, request.headers, time.time(), request.remote)
        body = await read_unverified_body(request, policy.bodies)
        peer = verify_request(
            policy.secret,
            request.headers,
            request.method,
            request.raw_path,
            body,
            policy.nonces,
            now=time.time(),
            skew_s=policy.skew_s,
        )
    except BodyRefused as exc:
        return await refused_answer(request, exc)
    except SkewError as exc:
        return await _skew_refusal(request, policy, exc)
    except TargetError as exc:
        log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote, exc)
        response = json_error(401, exc.reason, code="wrong_target", node=policy.node_id)
        if policy.node_id is not None:
            response.headers[HEADER_RECEIVER] = policy.node_id
        return response
    except AuthError as exc:
        log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote, exc)
        return json_error(401, exc.reason, code="unauthorized")
    CLOCK_SKEWS.clear(peer)
    request[PEER_ID] = peer
    token = REQUEST_SENDER.set(peer)
    try:
        return await handler(request)
    finally:
        REQUEST_SENDER.reset(token)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error answer is JSON in the one shape; client mistakes are 4xx, never 500. An
    AnsweredError is answered with its status, code and reason (a 503 with its Retry-After)."""
    try:
        return await handler(request)
    except AnsweredError as exc:
        retry_after_s = exc.retry_after_s if exc.status == 503 else None
        return error_response(exc.status, exc.reason, exc.code, retry_after_s=retry_after_s)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        text = exc.text
        reason = exc.reason if text is None or text.startswith(str(exc.status)) else text
        response = json_error(exc.status, reason)
        for name in ("Allow", "Retry-After"):
            if name in exc.headers:
                response.headers[name] = exc.headers[name]
        return response
    except json.JSONDecodeError as exc:
        return json_error(400, f"malformed JSON: {exc}", code="malformed_json")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return json_error(500, f"{request.method} {request.path} failed; see the node's log")


def bad_request(reason: str, *, code: str | None = None, **extra: Any) -> web.HTTPException:
    """A 400 to raise, whose body is the one error shape."""
    return error_exception(400, reason, code, **extra)
