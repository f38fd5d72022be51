"""Identities of the cluster: the CA (`shoal ca`), certificates whose CN is the identity and OU
the role, and the check of a peer's certificate. Not imported by `config` itself, so commands
that do not use certificates never load `cryptography`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from config.tls.ca import (
        CA_CERT,
        CA_KEY,
        CRL_DAYS,
        CRL_FILE,
        DEFAULT_CA_DAYS,
        DEFAULT_DAYS,
        MAX_DAYS,
        ClusterCa,
        IssuedFiles,
        init_ca,
        issue_certificate,
        load_ca,
        parse_san,
        revoke,
    )
    from config.tls.client import (
        TLS_CRL_ENV,
        TLS_ENV,
        client_scheme,
        operator_context,
        server_name,
    )
    from config.tls.context import (
        DEFAULT_CRL_NAME,
        NO_CHECK_TIME,
        TlsContexts,
        TlsFiles,
        TlsMaterial,
        crl_number,
        handshake_refusal,
        load_material,
    )
    from config.tls.identity import (
        IDENTITY_ATTRIBUTE,
        ROLE_ATTRIBUTE,
        CertRole,
        PeerIdentity,
        RefusalReason,
        identity_of,
        load_certificate,
        load_crl,
        role_of,
        serial_text,
        verify_peer_certificate,
    )
    from config.tls.store import INDEX_FILE, CaIndex, IssuedCertificate, read_index
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "config.tls.ca": (
                "CA_CERT CA_KEY CRL_DAYS CRL_FILE DEFAULT_CA_DAYS DEFAULT_DAYS MAX_DAYS ClusterCa "
                "IssuedFiles init_ca issue_certificate load_ca parse_san revoke"
            ),
            "config.tls.client": "TLS_CRL_ENV TLS_ENV client_scheme operator_context server_name",
            "config.tls.context": (
                "DEFAULT_CRL_NAME NO_CHECK_TIME TlsContexts TlsFiles TlsMaterial crl_number "
                "handshake_refusal load_material"
            ),
            "config.tls.identity": (
                "IDENTITY_ATTRIBUTE ROLE_ATTRIBUTE CertRole PeerIdentity RefusalReason "
                "identity_of load_certificate load_crl role_of serial_text "
                "verify_peer_certificate"
            ),
            "config.tls.store": "INDEX_FILE CaIndex IssuedCertificate read_index",
        },
    )

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CRL_DAYS",
    "CRL_FILE",
    "DEFAULT_CA_DAYS",
    "DEFAULT_CRL_NAME",
    "DEFAULT_DAYS",
    "IDENTITY_ATTRIBUTE",
    "INDEX_FILE",
    "MAX_DAYS",
    "NO_CHECK_TIME",
    "ROLE_ATTRIBUTE",
    "TLS_CRL_ENV",
    "TLS_ENV",
    "CaIndex",
    "CertRole",
    "ClusterCa",
    "IssuedCertificate",
    "IssuedFiles",
    "PeerIdentity",
    "RefusalReason",
    "TlsContexts",
    "TlsFiles",
    "TlsMaterial",
    "client_scheme",
    "crl_number",
    "handshake_refusal",
    "identity_of",
    "init_ca",
    "issue_certificate",
    "load_ca",
    "load_certificate",
    "load_crl",
    "load_material",
    "operator_context",
    "parse_san",
    "read_index",
    "revoke",
    "role_of",
    "serial_text",
    "server_name",
    "verify_peer_certificate",
]
