"""Who may call a route, decided from its declaration (config.declare): the declarations an app
serves by route, the caller class of a signer, a relayed operator's call, and the verdict of a
route for a class of caller. Deny by default: a class a route does not list is refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from config.declare import Caller, Route

__all__ = [
    "DECLARED",
    "FORWARDED_HEADER",
    "ROLE_NAMES",
    "SIGNER_CLASSES",
    "Verdict",
    "declaration_of",
    "is_public",
    "relayed",
    "signer_class",
    "verdict",
]

DECLARED: web.AppKey[Mapping[tuple[str, str], Route]] = web.AppKey("declared_routes")
"""The declaration of every route an app serves, by (method, path template)."""

FORWARDED_HEADER = "X-Shoal-Forwarded"
"""Set (to its own id) by a node that relays an operator's call to the node that acts on it:
the coordinator (locks, drains, runs, keyring) or the node asked to leave."""

SIGNER_CLASSES: Mapping[str, Caller] = {
    "cli-": Caller.OPERATOR,
    "api-": Caller.OPERATOR,
    "monitor-": Caller.READER,
}
"""The caller class of a signer (auth hmac) by the prefix of its id: `shoal` commands and the
sync API are operators, cluster_monitor a reader; any other signer is a node (a peer). Every
signer holds the one cluster secret, so this is what a signer says it is, not a proof; under
TLS the certificate's role decides."""

ROLE_NAMES: Mapping[Caller, str] = {
    Caller.PEER: "node",
    Caller.FENCED: "node",
    Caller.OPERATOR: "operator",
    Caller.READER: "reader",
}
"""The certificate role (config.tls.CertRole's value) of each class, as refusals name it."""


def declaration_of(request: web.Request) -> Route | None:
    """The declaration of the route `request` matched (a HEAD: its GET's), or None when it
    matched none (404, 405) or the app declares none."""
    info = request.match_info
    declarations = request.app.get(DECLARED)
    if info.http_exception is not None or declarations is None:
        return None
    resource = info.route.resource
    if resource is None:
        return None
    method = "GET" if info.route.method == "HEAD" else info.route.method
    return declarations.get((method, resource.canonical))


def is_public(request: web.Request) -> bool:
    """Whether `request` matched a route declared public (served without a credential)."""
    found = declaration_of(request)
    return found is not None and Caller.PUBLIC in found.callers


def relayed(request: web.Request) -> bool:
    """Whether a node relays an operator's call with `request` (FORWARDED_HEADER); a route
    declared `forwarded` admits such a node. The relay's proof of the operator is checked by
    node.security before this."""
    return bool(request.headers.get(FORWARDED_HEADER))


def signer_class(sender: str) -> Caller:
    """The class of an HMAC signer (SIGNER_CLASSES); a node id is a peer."""
    for prefix, caller in SIGNER_CLASSES.items():
        if sender.startswith(prefix):
            return caller
    return Caller.PEER


@dataclass(frozen=True)
class Verdict:
    """What a route decides for one caller: allowed, allowed only with the current plan's
    fence, or refused with the reason sent back."""

    allowed: bool
    needs_fence: bool = False
    reason: str = ""


def _listed(route: Route) -> str:
    return ", ".join(caller.value for caller in Caller if caller in route.callers)


def verdict(route: Route, caller: Caller, relaying: bool = False) -> Verdict:
    """The decision of `route` for a caller of class `caller` (PEER for a node); `relaying`:
    the node relays an operator's call (`relayed`)."""
    if route.admits(caller):
        return Verdict(True)
    role = ROLE_NAMES[caller]
    if caller is Caller.PEER and Caller.FENCED in route.callers:
        return Verdict(
            True,
            needs_fence=True,
            reason=f"role node may {route.operation} only with the current plan's fence"
            " (X-Shoal-Fence), as the coordinator's work; an operator certificate is needed"
            " otherwise",
        )
    if caller is Caller.PEER and route.forwarded and relaying:
        return Verdict(True)
    needed = "an operator certificate is needed" if Caller.OPERATOR in route.callers else ""
    return Verdict(
        False,
        reason=f"role {role} may not {route.operation}: it admits {_listed(route)}"
        + (f"; {needed}" if needed else ""),
    )
