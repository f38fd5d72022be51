"""Identities over TLS: the HTTP API's TLS listener, the client certificate as the caller's
identity, the access rules of every route (deny by default), and the CRL spread between nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.identity.crl import (
        CRL_NUMBER_HEADER,
        CRL_PATH,
        CrlSpread,
    )
    from node.identity.listener import IdentitySite
    from node.identity.peers import AUTH_META, peer_scheme, peer_tls
    from node.identity.revoked import CERT_META, RevokedPeers
    from node.identity.roles import (
        AccessRules,
        CertificateGate,
        caller_of,
        open_tls,
        tls_files,
    )
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.identity.crl": "CRL_NUMBER_HEADER CRL_PATH CrlSpread",
            "node.identity.listener": "IdentitySite",
            "node.identity.peers": "AUTH_META peer_scheme peer_tls",
            "node.identity.revoked": "CERT_META RevokedPeers",
            "node.identity.roles": "AccessRules CertificateGate caller_of open_tls tls_files",
        },
    )

__all__ = [
    "AUTH_META",
    "CERT_META",
    "CRL_NUMBER_HEADER",
    "CRL_PATH",
    "AccessRules",
    "CertificateGate",
    "CrlSpread",
    "IdentitySite",
    "RevokedPeers",
    "caller_of",
    "open_tls",
    "peer_scheme",
    "peer_tls",
    "tls_files",
]
