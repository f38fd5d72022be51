"""Who a caller is and what it may call: under TLS the identity and role come from the client
certificate (never from a header), checked against the CA and the CRL in use; under HMAC the
signer's id names its class. Each route's declaration lists the classes it admits (AccessRules):
deny by default. Every refusal is logged and counted."""

from __future__ import annotations

import hmac
import logging

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter

from config import HEADER_NODE, CertificateError, ConfigError
from config.declare import Caller, Route
from config.settings import AuthMode, NodeSettings
from config.tls import CertRole, PeerIdentity, RefusalReason
from config.tls.context import DEFAULT_CRL_NAME, TlsContexts, TlsFiles
from node.access import (
    ROLE_NAMES,
    Verdict,
    declaration_of,
    relayed,
    signer_class,
    verdict,
)
from node.fence import FenceSource, fence_refusal
from node.forwarding import TLS_VERIFIER
from node.identity.revoked import RevokedPeers
from node.plan import FENCE_HEADER
from node.security import (
    AUTH_POLICY,
    BROWSER_READER,
    PEER_ID,
    PEER_IDENTITY,
    REQUEST_SENDER,
    json_error,
)

__all__ = [
    "NO_CERTIFICATE",
    "AccessRules",
    "CertificateGate",
    "TlsCounters",
    "caller_of",
    "open_tls",
    "tls_files",
]

log = logging.getLogger(__name__)

NO_CERTIFICATE = "no_certificate"
"""The `reason` label of a TLS request without a client certificate on a route that needs one."""
CERTIFICATE_CLASSES = {
    CertRole.NODE: Caller.PEER,
    CertRole.OPERATOR: Caller.OPERATOR,
    CertRole.READER: Caller.READER,
}
"""The caller class of each certificate role."""


class TlsCounters:
    """`shoal_tls_refused_total{reason}`: certificates refused, handshakes included."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.refused = Counter(
            "shoal_tls_refused",
            "Peer certificates refused (expired, not_yet_valid, other_ca, revoked, bad_identity,"
            " no_certificate), by reason",
            ["reason"],
            registry=registry,
        )


def _bearer_ok(request: web.Request) -> bool:
    """Whether `request` carries this node's metrics bearer token (none set: never)."""
    token = request.app[AUTH_POLICY].metrics_token
    header = request.headers.get("Authorization", "")
    if token is None or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token)


def _served_without_certificate(request: web.Request) -> bool:
    """A public route, or one that takes the metrics bearer token and was given it."""
    route = declaration_of(request)
    if route is None:
        return False
    return Caller.PUBLIC in route.callers or (route.bearer and _bearer_ok(request))


def caller_of(request: web.Request) -> Caller | None:
    """The class of `request`'s caller: its certificate's role, the dashboard's reader, or its
    signer (node.access.signer_class); None without a credential."""
    identity = request.get(PEER_IDENTITY)
    if identity is not None:
        return CERTIFICATE_CLASSES[identity.role]
    if request.get(BROWSER_READER, False):
        return Caller.READER
    sender = request.get(PEER_ID)
    return None if sender is None else signer_class(sender)


class CertificateGate:
    """The server side of TLS identities for one node: its contexts, the auth mode, the fence
    of the plan it applies, and the counters. `certificate_middleware` runs before the HMAC
    check; what a role may call is AccessRules'."""

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
        public = _served_without_certificate(request)
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


class AccessRules:
    """Deny by default: every request is checked against the declaration of the route it
    matched (config.declare's callers). A class the route does not list gets 403 `forbidden`
    naming the role; a node calling a `fenced` route needs the current plan's fence (409 when
    it sends another plan's); a node relaying an operator's call passes a `forwarded` route.
    Without a secret and without TLS (a loopback dev node) every caller may call every route.
    Refusals are logged and counted (`shoal_role_refused_total{role}`)."""

    def __init__(
        self, fence: FenceSource | None, registry: CollectorRegistry | None, open_api: bool
    ) -> None:
        self.fence = fence
        self.open_api = open_api
        self.refused = Counter(
            "shoal_role_refused",
            "Calls refused because of the caller's role, by role",
            ["role"],
            registry=registry,
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = declaration_of(request)
        if route is None or Caller.PUBLIC in route.callers:
            return await handler(request)
        caller = caller_of(request)
        if caller is None:
            if self.open_api or route.bearer:
                return await handler(request)
            return json_error(401, f"{route.operation} needs a credential", code="unauthorized")
        decided = verdict(route, caller, relayed(request))
        if decided.allowed and decided.needs_fence:
            if FENCE_HEADER not in request.headers:
                decided = Verdict(False, reason=decided.reason)
            else:
                current = None if self.fence is None else self.fence()
                refusal = fence_refusal(request, current, required=True)
                if refusal is not None:
                    return refusal
        if decided.allowed:
            return await handler(request)
        return self._refuse(request, route, caller, decided.reason)

    def _refuse(
        self, request: web.Request, route: Route, caller: Caller, reason: str
    ) -> web.Response:
        role = ROLE_NAMES[caller]
        name = str(request.get(PEER_ID, "the dashboard's reader"))
        self.refused.labels(role=role).inc()
        log.warning(
            "refused %s %s (%s) from %s, identity %r role %s: %s",
            request.method,
            request.path,
            route.path,
            request.remote,
            name,
            role,
            reason,
        )
        return json_error(403, reason, code="forbidden", identity=name, role=role)


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
