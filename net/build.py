"""The one place that turns a peer's address into its base URL (the scheme is chosen here, and
only here), and a call into a signed PeerRequest (config.auth's signature, X-Shoal-Cluster)."""

from __future__ import annotations

import ipaddress
import json as jsonlib
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from yarl import URL

from config.auth import HEADER_CLUSTER, SigningTargets, signed_headers
from net.errors import PeerRequestError
from net.transport import PeerRequest

__all__ = ["Identity", "base_url", "build_request", "local_url", "peer_url", "split_url"]

Params = Mapping[str, str | int | float] | Sequence[tuple[str, str]] | None
"""Query parameters: a mapping, or pairs (a name may repeat)."""


def base_url(address: str, *, tls: bool = False) -> str:
    """`scheme://host:port` of a peer from `host:port`, `[v6]:port`, a bare IPv6 address with a
    port after its last colon, or a URL (whose path and trailing slash are dropped). The scheme
    is https when `tls` or the URL says https, else http. PeerRequestError when there is no
    port."""
    text = address.strip()
    if "://" in text:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
        tls = tls or parts.scheme == "https"
    elif text.startswith("["):
        parts = urlsplit(f"http://{text}")
        host, port = parts.hostname, parts.port
    else:
        host, _, port_text = text.rpartition(":")
        port = int(port_text) if port_text.isdigit() else None
    if not host or port is None:
        raise PeerRequestError(address, "not a peer address (HOST:PORT or http://HOST:PORT)")
    return peer_url(host, port, tls=tls)


def peer_url(host: str, port: int | str, *, tls: bool = False) -> str:
    """`scheme://host:port` of a peer: an IPv6 literal in brackets (`::1` ->
    `http://[::1]:8770`; given bracketed, kept so), an IPv4 address or a hostname as it is;
    https when `tls`. Every URL a node or a command makes for a peer comes from here."""
    bare = host.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        literal = ipaddress.ip_address(bare)
    except ValueError:
        literal = None
    shown = f"[{bare}]" if literal is not None and literal.version == 6 else bare
    return f"{'https' if tls else 'http'}://{shown}:{int(port)}"


def local_url(bind: str, port: int | str, *, tls: bool = False) -> str:
    """The URL a process on this host reaches a node bound to `bind` at: a wildcard bind
    (`0.0.0.0`, `*`, empty) on 127.0.0.1, `::` on `::1`, any other address as it is."""
    host = bind.strip()
    if host in ("0.0.0.0", "", "*"):  # noqa: S104 - a wildcard bind is reached on loopback
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    return peer_url(host, port, tls=tls)


def split_url(url: str) -> tuple[str, str]:
    """(base URL, path and query) of a full URL, for callers that were handed one."""
    parts = urlsplit(url)
    path_qs = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return base_url(url), path_qs


@dataclass(frozen=True)
class Identity:
    """Who this client is to its peers: the cluster `secret` that signs every request (None:
    unsigned, a dev cluster), the `node_id` it signs as (a node's id, or `cli-HOST` for a
    command), and the `cluster` it names in X-Shoal-Cluster (None: no header)."""

    secret: bytes | None = None
    node_id: str = ""
    cluster: str | None = None
    targets: SigningTargets = field(default_factory=SigningTargets, compare=False, repr=False)
    """The node id of each peer signed for, as learnt from its answers (config.auth)."""
    prover: Callable[[str, str, bytes, str], dict[str, str]] | None = field(
        default=None, compare=False, repr=False
    )
    """An operator's certificate proof of each request that is not a GET (method, path with
    query, body, the node asked) -> its headers (config.tls.proof), which a node that forwards
    the request passes on."""

    @classmethod
    def of_command(cls, secret: bytes | None, cluster: str | None = None) -> Identity:
        """The identity of a command run by an operator on this host (`cli-HOSTNAME`)."""
        return cls(secret, f"cli-{socket.gethostname()}", cluster)


def build_request(
    identity: Identity,
    method: str,
    base: str,
    path: str,
    *,
    json: Any = None,
    data: bytes | None = None,
    params: Params = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float,
) -> PeerRequest:
    """A complete request: the query of `params` appended to `path`, the body (`json` encoded,
    or `data` as given), and the signature over method, path and query, body and time."""
    if json is not None and data is not None:
        raise ValueError("give json or data, not both")
    path_qs = path if path.startswith("/") else f"/{path}"
    if params:
        # encoded as aiohttp encodes `params` (yarl): "/" stays, as the file routes require
        pairs = params.items() if isinstance(params, Mapping) else params
        query = URL.build(query=[(key, str(value)) for key, value in pairs])
        path_qs += ("&" if "?" in path_qs else "?") + query.raw_query_string
    body = jsonlib.dumps(json).encode() if json is not None else (data or b"")
    sent = {"Accept": "application/json"}
    if json is not None:
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    secret = identity.secret
    resign = None
    if secret is not None:

        def resign() -> dict[str, str]:
            return signed_headers(
                secret, identity.node_id, method, path_qs, body, cluster=identity.cluster,
                target=identity.targets.target_for(base), headers=sent,
            )  # fmt: skip

        sent.update(resign())
    elif identity.cluster:
        sent[HEADER_CLUSTER] = identity.cluster
    return PeerRequest(method.upper(), base, path_qs, sent, body, timeout_s, resign=resign)
