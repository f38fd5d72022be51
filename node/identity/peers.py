"""Which peers a node calls over TLS, and as whom: the one factory of the per-peer TLS choice
(net.PeerTls) that every peer client a node makes is given. A peer's scheme follows both auth
modes (`peer_scheme`: the hmac -> hmac+tls -> tls migration); the name its certificate must
carry is its node id (node certificates hold it as a DNS name)."""

from __future__ import annotations

import ssl

from config.settings import AuthMode
from net import PeerTls
from node.runtime import NodeRuntime

__all__ = ["AUTH_META", "peer_scheme", "peer_tls"]

AUTH_META = "auth"
"""The membership meta key in which a node gossips its auth mode, so peers know its scheme."""


def peer_scheme(own: AuthMode, peer_auth: object) -> str:
    """`https` or `http` for a call from a node of auth mode `own` to a peer whose membership
    meta says `peer_auth` (None when it says nothing: a node of an older release, `hmac`).
    A `tls` node always calls TLS; a `hmac+tls` node calls TLS to peers that serve it and
    signed plain HTTP to the others (the rolling migration); a `hmac` node calls plain HTTP."""
    if own is AuthMode.TLS:
        return "https"
    if own is AuthMode.HMAC_TLS and peer_auth in (AuthMode.TLS.value, AuthMode.HMAC_TLS.value):
        return "https"
    return "http"


def _split(netloc: str) -> tuple[str, int | None]:
    host, _, port = netloc.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else None


def peer_tls(runtime: NodeRuntime) -> PeerTls | None:
    """The per-peer TLS choice of this node's peer clients; None when it has no TLS (`auth:
    hmac`: every call plain). For a peer's `host:port` it finds the member at that address in
    `runtime.membership` (this node itself included) and answers (`runtime.tls`'s client
    context of the moment, the member's node id) when `peer_scheme` says https, else None.
    An address no member holds yet (a seed, an inventory host before it joined) is called
    over TLS only by a `tls` node, checked against the host as its certificate's name."""
    contexts = runtime.tls
    if contexts is None:
        return None
    own = runtime.settings.auth_mode

    def choose(netloc: str) -> tuple[ssl.SSLContext, str] | None:
        host, port = _split(netloc)
        if host == runtime.address and port == (runtime.port or runtime.settings.port):
            return contexts.client_context(), runtime.node_id
        membership = runtime.membership
        for member in membership.members() if membership is not None else ():
            if member.address == host and member.port == port:
                if peer_scheme(own, member.meta.get(AUTH_META)) != "https":
                    return None
                return contexts.client_context(), member.node_id
        if own is AuthMode.TLS:
            return contexts.client_context(), host
        return None

    return choose
