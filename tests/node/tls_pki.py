"""A cluster CA with node, operator and reader certificates for TLS tests, the settings of a
node that serves with one, and client contexts of each identity."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from config.tls import CA_CERT, CRL_FILE, CertRole, init_ca, issue_certificate


@dataclass(frozen=True)
class Pki:
    """`root/ca` the CA dir, `root/NAME/NAME.{crt,key}` and `root/NAME/ca.crt` each identity."""

    root: Path

    @property
    def ca_dir(self) -> Path:
        return self.root / "ca"

    @property
    def ca_cert(self) -> Path:
        return self.ca_dir / CA_CERT

    @property
    def ca_crl(self) -> Path:
        return self.ca_dir / CRL_FILE

    def cert(self, name: str) -> Path:
        return self.root / name / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.root / name / f"{name}.key"

    def issue(
        self,
        name: str,
        role: CertRole,
        *,
        days: int = 30,
        now: datetime | None = None,
        ca_dir: Path | None = None,
    ) -> None:
        sans = ["127.0.0.1"] if role is CertRole.NODE else []
        issue_certificate(
            ca_dir or self.ca_dir,
            name,
            role,
            out=self.root / name,
            days=days,
            sans=sans,
            force=True,
            now=now,
        )

    def node_tls(self, name: str, **extra: Any) -> dict[str, Any]:
        """The `tls` section of node `name` (its CRL in its own dir, a copy of the CA's)."""
        crl = self.root / name / "crl.pem"
        if not crl.exists():
            crl.write_bytes(self.ca_crl.read_bytes())
        return {
            "ca": str(self.ca_cert),
            "cert": str(self.cert(name)),
            "key": str(self.key(name)),
            "crl": str(crl),
            **extra,
        }

    def client(self, name: str | None) -> ssl.SSLContext:
        """A TLS 1.3 client context presenting `name`'s certificate (None: none), verifying
        the server against the CA."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_verify_locations(cafile=self.ca_cert)
        if name is not None:
            context.load_cert_chain(self.cert(name), self.key(name))
        return context


def make_pki(root: Path, nodes: tuple[str, ...] = ("a", "b")) -> Pki:
    """A CA and: node certificates for `nodes`, operator `alice`, reader `rita`."""
    pki = Pki(root)
    init_ca(pki.ca_dir)
    for name in nodes:
        pki.issue(name, CertRole.NODE)
    pki.issue("alice", CertRole.OPERATOR)
    pki.issue("rita", CertRole.READER)
    return pki
