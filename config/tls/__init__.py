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
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
