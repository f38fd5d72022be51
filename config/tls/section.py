"""The `tls:` section of a node's settings (config.settings uses it), and how many threads
terminate the node's TLS connections by default (`tls.workers`, node.identity.terminator)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_CRL_REFRESH_S",
    "MAX_TLS_WORKERS",
    "TLS_WORKERS_FROM_CPUS",
    "TlsSettings",
    "default_tls_workers",
]

MAX_TLS_WORKERS = 64
TLS_WORKERS_FROM_CPUS = 4
"""Below this many CPUs the event loop encrypts itself: on 2 cores a worker thread moves the
encryption off the loop but adds the socket pair's copies, and the client or the loop already
holds the other core (docs/benchmarks.md, TLS)."""
MOST_BY_DEFAULT = 4


def default_tls_workers(cpus: int) -> int:
    """The `tls.workers` default on a host of `cpus` CPUs: a quarter of them, at most
    MOST_BY_DEFAULT, and none below TLS_WORKERS_FROM_CPUS."""
    return 0 if cpus < TLS_WORKERS_FROM_CPUS else min(MOST_BY_DEFAULT, cpus // 4)


DEFAULT_CRL_REFRESH_S = 30.0


class TlsSettings(BaseModel):
    """The `tls:` section: this node's certificate from the cluster CA (`shoal ca issue NAME
    --role node`), the CA certificate, and the CRL. Reloaded on SIGHUP and when a file changes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ca: Path = Field(
        description="The cluster CA certificate (ca.crt): every peer's must chain to it."
    )
    cert: Path = Field(description="This node's certificate (NAME.crt, role node).")
    key: Path = Field(description="This node's private key (NAME.key, chmod 600).")
    crl: Path | None = Field(
        None,
        description="The CA's revocation list (crl.pem); a newer one learnt from a peer is "
        "written here (default DATA_DIR/tls/crl.pem).",
    )
    crl_refresh_s: float = Field(
        DEFAULT_CRL_REFRESH_S,
        gt=0,
        description="How often the CRL of every alive peer is fetched; the newest CRL number wins.",
    )
    workers: int | None = Field(
        None,
        ge=0,
        le=MAX_TLS_WORKERS,
        description="Threads that do the API's TLS handshakes and encryption off the event loop "
        "(0: the event loop does them; default: a quarter of the CPUs, at most 4, and 0 below "
        f"{TLS_WORKERS_FROM_CPUS} CPUs).",
    )

    @property
    def worker_count(self) -> int:
        """`workers`, or its default for this host's CPUs."""
        if self.workers is not None:
            return self.workers
        return default_tls_workers(os.cpu_count() or 1)
