"""Finding 7: commands and cluster_monitor loaded no CRL and did not check the server's name, so a
revoked node key could pose as any node to operators. Now their context checks the CRL of
SHOAL_TLS_CRL (default `crl.pem` beside SHOAL_TLS_CA) and that the server's certificate names
the node asked (the URL's host, or the node id the caller knows for that address)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from config.tls import CertRole, init_ca, operator_context, revoke, server_name
from health.monitor.client import ClusterMonitor
from node.cli.common import peer_client
from node.daemon import NodeDaemon
from node.errors import PeerRequestError
from tests.node.daemons import test_settings
from tests.node.tls_pki import Pki


def _pki(tmp_path: Path) -> Pki:
    pki = Pki(tmp_path / "pki")
    pki.root.mkdir()
    init_ca(pki.ca_dir)
    for name in ("a", "b"):
        pki.issue(name, CertRole.NODE)
    pki.issue("alice", CertRole.OPERATOR)
    return pki


def _env(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "SHOAL_TLS_CERT": str(pki.cert("alice")),
        "SHOAL_TLS_KEY": str(pki.key("alice")),
        "SHOAL_TLS_CA": str(pki.root / "alice" / "ca.crt"),  # with the crl.pem of its issue
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


async def _handshake(port: int, context: ssl.SSLContext, name: str) -> str | None:
    """None when the handshake with `name` checked succeeds, else OpenSSL's reason."""
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname=name
        )
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    writer.close()
    await writer.wait_closed()
    return None


async def test_operator_context_crl_and_name_refuse_a_misnamed_or_revoked_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = _pki(tmp_path)
    env = _env(pki, monkeypatch)
    async with NodeDaemon(test_settings(tmp_path, "a", tls=pki.node_tls("a"))) as daemon:
        port = daemon.port
        context = operator_context(env)
        assert context is not None
        assert await _handshake(port, context, "a") is None
        assert await _handshake(port, context, "127.0.0.1") is None  # an address SAN of a
        assert "mismatch" in str(await _handshake(port, context, "b"))
        # a command asking node b at a's address is refused in the handshake
        settings = test_settings(tmp_path, "cli", secret_file=None)
        async with peer_client(settings, timeout_s=5.0) as peers:
            answer = await peers.request("GET", f"https://127.0.0.1:{port}", "/v1/status")
            assert answer.status == 200
        assert server_name(f"https://127.0.0.1:{port}", {f"127.0.0.1:{port}": "b"}) == "b"

        revoke(pki.ca_dir, "a")  # the operator's crl.pem beside ca.crt is the CA's old one
        assert await _handshake(port, operator_context(env), "a") is None
        fresh = operator_context({**env, "SHOAL_TLS_CRL": str(pki.ca_crl)})
        assert fresh is not None
        assert "revoked" in str(await _handshake(port, fresh, "a"))
        monkeypatch.setenv("SHOAL_TLS_CRL", str(pki.ca_crl))
        async with peer_client(settings, timeout_s=5.0) as peers:
            with pytest.raises(PeerRequestError, match="revoked"):
                await peers.request("GET", f"https://127.0.0.1:{port}", "/v1/status")
        async with ClusterMonitor([f"https://127.0.0.1:{port}"], timeout_s=5.0) as monitor:
            row = (await monitor.get_cluster_status()).nodes[0]
            assert row.error is not None
            assert "revoked" in row.error


async def test_operator_context_crl_and_name_from_the_monitors_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = _pki(tmp_path)
    _env(pki, monkeypatch)
    async with NodeDaemon(test_settings(tmp_path, "a", tls=pki.node_tls("a"))) as daemon:
        url = f"https://127.0.0.1:{daemon.port}"
        async with ClusterMonitor([url], timeout_s=5.0) as monitor:
            status = await monitor.get_cluster_status()
            assert [(n.node_id, n.error) for n in status.nodes] == [("a", None)]
            # the monitor now knows a's address as node a; a certificate naming b there fails
            monitor._names[f"127.0.0.1:{daemon.port}"] = "b"
            status = await monitor.get_cluster_status()
            assert status.nodes[0].error is not None
            assert "mismatch" in status.nodes[0].error
