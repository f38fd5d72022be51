"""Who a TLS caller is and what it may call: the identity and role come from the client
certificate (never from a header), each request is checked against the CA and the CRL in use,
and the role decides the routes (`node`: peer calls, work-plane calls only with the current
plan's fence; `operator`: everything; `reader`: GET only). Every refusal is logged and counted."""

from __future__ import annotations

import dataclasses
import hmac
import logging

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter

from config import HEADER_NODE, CertificateError, ConfigError
from config.settings import AuthMode, NodeSettings
from config.tls import CertRole, PeerIdentity, RefusalReason
from config.tls.context import DEFAULT_CRL_NAME, TlsContexts, TlsFiles
from node.fence import FenceSource, fence_refusal
from node.forwarding import TLS_VERIFIER
from node.identity.revoked import RevokedPeers
from node.plan import FENCE_HEADER
from node.security import (
    AUTH_POLICY,
    PEER_ID,
    PEER_IDENTITY,
    REQUEST_SENDER,
    UNAUTHENTICATED,
    json_error,
)

__all__ = [
    "NODE_FENCED",
    "NODE_FORBIDDEN",
    "NO_CERTIFICATE",
    "PUBLIC_ROUTES",
    "READ_METHODS",
    "CertificateGate",
    "RoleVerdict",
    "TlsCounters",
    "open_tls",
    "role_verdict",
    "tls_files",
]

log = logging.getLogger(__name__)

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PUBLIC_ROUTES = frozenset({*UNAUTHENTICATED, ("GET", "/metrics")})
"""Served without a client certificate: health and the OpenAPI document (no secret in them),
and /metrics, which keeps its bearer token (or a signature, or a certificate)."""
NO_CERTIFICATE = "no_certificate"
"""The `reason` label of a TLS request without a client certificate on a route that needs one."""

NODE_FENCED = frozenset(
    {
        ("POST", "/v1/jobs"),
        ("POST", "/v1/jobs/{job_id}/kill"),
        ("POST", "/v1/weights/update"),
        ("POST", "/v1/results/fetch"),
    }
)
"""Work-plane routes a `node` identity may call only with the fence of the plan this node
applies (gang member starts and kills, a run's job, weights offers, result fetches): what a node
does because of the coordinator, never on its own."""
NODE_FORBIDDEN = frozenset(
    {
        ("DELETE", "/v1/jobs/{job_id}"),
        ("POST", "/v1/runs"),
        ("POST", "/v1/runs/{run_id}/cancel"),
        ("POST", "/v1/backup"),
        ("POST", "/v1/sync/run"),
        ("POST", "/ui/login"),
    }
)
"""Operator routes no node ever calls on a peer: a `node` identity gets 403 whatever it sends."""


@dataclasses.dataclass(frozen=True)
class RoleVerdict:
    """What a role may do with one route: allowed, allowed only with the current plan's fence,
    or refused with the reason sent back."""

    allowed: bool
    needs_fence: bool = False
    reason: str = ""


def role_verdict(role: CertRole, method: str, route: str) -> RoleVerdict:
    """The decision for `role` calling `method` on the route pattern `route`
    (`/v1/jobs/{job_id}/kill`, not the path)."""
    method = method.upper()
    if role is CertRole.OPERATOR:
        return RoleVerdict(True)
    if role is CertRole.READER:
        if method in READ_METHODS:
            return RoleVerdict(True)
        return RoleVerdict(
            False,
            reason=f"role reader may only read (GET); {method} {route} needs an operator",
        )
    if method in READ_METHODS:
        return RoleVerdict(True)
    if (method, route) in NODE_FORBIDDEN:
        return RoleVerdict(
            False,
            reason=f"role node may not {method} {route}: an operator certificate is needed",
        )
    if (method, route) in NODE_FENCED:
        return RoleVerdict(
            True,
            needs_fence=True,
            reason=f"role node may {method} {route} only with the current plan's fence"
            f" ({FENCE_HEADER}), as the coordinator's work; an operator certificate is needed"
            " otherwise",
        )
    return RoleVerdict(True)


class TlsCounters:
    """`shoal_tls_refused_total{reason}` (certificates refused, handshakes included) and
    `shoal_role_refused_total{role}` (calls a role may not make)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.refused = Counter(
            "shoal_tls_refused",
            "Peer certificates refused (expired, not_yet_valid, other_ca, revoked, bad_identity,"
            " no_certificate), by reason",
            ["reason"],
            registry=registry,
        )
        self.forbidden = Counter(
            "shoal_role_refused",
            "Calls refused because of the caller's role, by role",
            ["role"],
            registry=registry,
        )


def _bearer_ok(request: web.Request) -> bool:
    """Whether `request` carries this node's metrics bearer token (none set: never)."""
    token = request.app[AUTH_POLICY].metrics_token
    header = request.headers.get("Authorization", "")
    if token is None or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token)


def _route_of(request: web.Request) -> str:
    info = request.match_info
    route = info.route if info.http_exception is None else None
    resource = None if route is None else route.resource
    return resource.canonical if resource is not None else request.path


class CertificateGate:
    """The server side of TLS identities for one node: its contexts, the auth mode, the fence
    of the plan it applies, and the counters. `certificate_middleware` runs before the HMAC
    check, `role_middleware` after it."""

    def __init__(
        self,
        contexts: TlsContexts,
        mode: AuthMode,
        fence: FenceSource,
        registry: CollectorRegistry | None,
        revoked_peers: RevokedPeers | None = None,
    ) -> None:
        self.contexts = contexts
        self.mode = mode
        self.fence = fence
        self.counters = TlsCounters(registry)
        self.revoked_peers = revoked_peers

    def refused(self, peer: str, identity: str, reason: str, detail: str) -> None:
        """Log and count a refused certificate of `peer` (an address) claiming `identity`."""
        self.counters.refused.labels(reason=reason).inc()
        log.warning(
            "refused the certificate of %s (identity %r, %s): %s", peer, identity, reason, detail
        )

    def identify(self, request: web.Request) -> PeerIdentity | CertificateError | None:
        """The verified identity of the client certificate of `request`'s connection, the
        refusal when it is not acceptable now, or None without TLS or without a certificate."""
        transport = request.transport
        ssl_object = None if transport is None else transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return None
        der = ssl_object.getpeercert(binary_form=True)
        if not der:
            return None
        try:
            return self.contexts.verify_peer(der)
        except CertificateError as exc:
            return exc

    def _note_serial(self, found: PeerIdentity | CertificateError | None) -> None:
        """Tell the revoked-peers book which certificate a node's call presented."""
        book = self.revoked_peers
        if book is None or found is None:
            return
        if isinstance(found, CertificateError):
            if found.reason == RefusalReason.REVOKED and found.serial is not None:
                book.saw(found.identity, found.serial, verified=False)
        elif found.role == CertRole.NODE:
            book.saw(found.name, found.serial, verified=True)

    @web.middleware
    async def certificate_middleware(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Set the caller's identity from its certificate (PEER_IDENTITY, PEER_ID, the audit's
        sender); refuse a certificate that is not acceptable now (401 `certificate_refused`
        naming the identity and reason), and a request over TLS without a certificate on a
        route that needs one (401 `certificate_required`; `hmac+tls` lets it on to the
        signature check). A sender header that names someone else is ignored."""
        found = self.identify(request)
        is_tls = (
            request.transport is not None
            and request.transport.get_extra_info("ssl_object") is not None
        )
        public = (request.method, request.path) in PUBLIC_ROUTES
        if public and request.path == "/metrics" and found is None and not self.mode.accepts_hmac:
            public = _bearer_ok(request)
        self._note_serial(found)
        if isinstance(found, CertificateError):
            self.refused(str(request.remote), found.identity, found.reason, found.detail)
            return json_error(
                401,
                f"{found}",
                code="certificate_refused",
                identity=found.identity,
                refusal=found.reason,
            )
        if found is None:
            if is_tls and not public and not self.mode.accepts_hmac:
                if request.match_info.http_exception is not None:
                    return await handler(request)
                self.counters.refused.labels(reason=NO_CERTIFICATE).inc()
                log.debug(
                    "refused %s %s from %s: TLS without a client certificate",
                    request.method,
                    request.path,
                    request.remote,
                )
                return json_error(
                    401,
                    "this node needs a client certificate of the cluster CA (auth tls): present"
                    " one (SHOAL_TLS_CERT, SHOAL_TLS_KEY, SHOAL_TLS_CA for `shoal`)",
                    code="certificate_required",
                )
            return await handler(request)
        claimed = request.headers.get(HEADER_NODE)
        if claimed and claimed != found.name:
            log.debug(
                "%s %s: header %s names %r, the certificate %r; the certificate wins",
                request.method,
                request.path,
                HEADER_NODE,
                claimed[:80],
                found.name,
            )
        request[PEER_IDENTITY] = found
        request[PEER_ID] = found.name
        request[TLS_VERIFIER] = self.contexts.verify_peer  # (a forwarded operator's proof)
        token = REQUEST_SENDER.set(found.name)
        try:
            return await handler(request)
        finally:
            REQUEST_SENDER.reset(token)

    @web.middleware
    async def role_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse (403 `forbidden`, naming the role) what the certificate's role may not call;
        a `node` calling a fenced work-plane route needs the current plan's fence (409 when it
        sends another plan's). Requests without a certificate (HMAC-signed, public) pass."""
        identity = request.get(PEER_IDENTITY)
        if identity is None or request.match_info.http_exception is not None:
            return await handler(request)
        route = _route_of(request)
        verdict = role_verdict(identity.role, request.method, route)
        if verdict.allowed and verdict.needs_fence:
            if FENCE_HEADER not in request.headers:
                verdict = RoleVerdict(False, reason=verdict.reason)
            else:
                refusal = fence_refusal(request, self.fence(), required=True)
                if refusal is not None:
                    return refusal
        if verdict.allowed:
            return await handler(request)
        self.counters.forbidden.labels(role=identity.role.value).inc()
        log.warning(
            "refused %s %s (%s) from %s, identity %r role %s: %s",
            request.method,
            request.path,
            route,
            request.remote,
            identity.name,
            identity.role.value,
            verdict.reason,
        )
        return json_error(
            403, verdict.reason, code="forbidden", identity=identity.name, role=identity.role.value
        )


def tls_files(settings: NodeSettings) -> TlsFiles | None:
    """The TLS files of `settings`, or None without a `tls` section."""
    section = settings.tls
    if section is None:
        return None
    crl = section.crl.expanduser() if section.crl is not None else None
    return TlsFiles(
        ca=section.ca.expanduser(),
        cert=section.cert.expanduser(),
        key=section.key.expanduser(),
        crl=crl if crl is not None else settings.data_dir / DEFAULT_CRL_NAME,
        crl_required=crl is not None,
    )


def open_tls(settings: NodeSettings, node_id: str) -> TlsContexts | None:
    """The node's TLS contexts when its auth uses TLS (None with `auth: hmac`). ConfigError
    naming the setting and the file when one is missing or wrong, or when the certificate names
    another identity than `node_id`: the daemon does not start."""
    files = tls_files(settings)
    if files is None or not settings.auth_mode.uses_tls:
        return None
    contexts = TlsContexts(files)
    if contexts.material.own.name != node_id:
        raise ConfigError(
            f"tls.cert: {files.cert}: the certificate names {contexts.material.own.name!r}, this"
            f" node is {node_id!r}; issue one with `shoal ca issue {node_id} --role node`"
        )
    return contexts
