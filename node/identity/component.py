"""The API's TLS side as the daemon wires it: the certificate and role checks of its routes and
the CRL spread (`api_identity`), and the listening site (`api_site`)."""

from __future__ import annotations

import socket
from collections.abc import Callable

from aiohttp import web

from config import NodeSettings
from config.tls import TlsContexts
from node.connections import ConnectionBudget, GuardedSite
from node.identity.crl import CrlSpread
from node.identity.listener import IdentitySite
from node.identity.revoked import RevokedPeers
from node.identity.roles import CertificateGate
from node.identity.terminator import TlsWorkers
from node.plan import PlanFence
from node.runtime import NodeRuntime


def api_identity(
    runtime: NodeRuntime, tls: TlsContexts | None, fence: Callable[[], PlanFence | None]
) -> tuple[CertificateGate | None, CrlSpread | None]:
    """With TLS (`tls` and the settings' `tls` section): the certificate and role checks of the
    API, fenced work-plane calls checked against `fence` (the plan this node applies), and the
    CRL spread; (None, None) without TLS. The caller closes the spread."""
    settings = runtime.settings
    if tls is None or settings.tls is None:
        return None, None
    registry = runtime.metrics.registry if runtime.metrics is not None else None
    revoked = RevokedPeers(tls, runtime.node_id)
    gate = CertificateGate(tls, settings.auth_mode, fence, registry, revoked)
    return gate, CrlSpread(runtime, tls, settings.tls.crl_refresh_s, revoked)


def api_tls_workers(settings: NodeSettings) -> TlsWorkers | None:
    """The threads that terminate the API's TLS connections (`tls.workers`), not started; None
    without TLS or with 0."""
    if settings.tls is None or not settings.auth_mode.uses_tls:
        return None
    count = settings.tls.worker_count
    return TlsWorkers(count, name="api-tls") if count else None


def api_site(
    runner: web.AppRunner,
    sockets: list[socket.socket],
    settings: NodeSettings,
    identity: CertificateGate | None,
    workers: TlsWorkers | None = None,
) -> web.BaseSite:
    """Plain HTTP (auth hmac), or TLS 1.3 with plain HTTP where the auth mode allows it, on the
    bound `sockets`; either way each connection within the budgets of node.connections. TLS
    connections are terminated by `workers` when given (started and stopped by the caller)."""
    if identity is None:
        return GuardedSite(runner, sockets, ConnectionBudget())
    return IdentitySite(
        runner,
        sockets,
        contexts=identity.contexts,
        mode=settings.auth_mode,
        plain_ok=settings.secret_file is not None,
        refused=identity.refused,
        workers=workers,
    )
