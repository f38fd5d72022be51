"""Finding 11: a revoked node that still holds the gossip key advertised a made-up `cert_serial`
and was alive again in SWIM. Now an advertised serial may add a refusal but never lift one: only
a verified handshake with a certificate that is not revoked, made after the refusal, does; and
the CRL spread calls members seen dead too, so a node given a new certificate gets that
handshake in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from config.tls import CertRole, TlsContexts, load_certificate, revoke, serial_text
from node.daemon import NodeDaemon
from node.identity import CERT_META, RevokedPeers, tls_files
from node.identity.crl import CrlSpread
from tests.node.daemons import test_settings
from tests.node.test_revoked_peers import FakeMembership, View
from tests.node.test_tls_revoked_member import _refused, _view
from tests.node.tls_pki import make_pki

REFRESH_S = 0.5
MADE_UP = "ABCDEF0123456789"


def test_revocation_lifted_by_claim_never_by_an_advertised_serial(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", nodes=("a", "b"))
    files = tls_files(test_settings(tmp_path, "a", tls=pki.node_tls("a")))
    assert files is not None
    contexts = TlsContexts(files)
    revoked = load_certificate(pki.cert("b")).serial_number
    b = View("b", {CERT_META: serial_text(revoked)})
    membership = FakeMembership([View("a", {}, is_self=True), b])
    book = RevokedPeers(contexts, "a")
    book.saw("b", revoked, verified=True)  # before the revocation: a good handshake
    assert book.apply(membership) == {}
    revoke(pki.ca_dir, "b")
    assert contexts.install_crl(pki.ca_crl.read_bytes(), "test")
    assert sorted(book.apply(membership)) == ["b"]
    b.meta = {CERT_META: MADE_UP}  # the thief's claim
    for _ in range(3):
        assert sorted(book.apply(membership)) == ["b"], "a claim lifted the refusal"
    book.saw("b", revoked, verified=False)  # its call presents the revoked certificate
    assert sorted(book.apply(membership)) == ["b"]
    pki.issue("b", CertRole.NODE)
    fresh = load_certificate(pki.cert("b")).serial_number
    book.saw("b", fresh, verified=True)  # a reissued b calls: the proof
    assert book.apply(membership) == {}
    assert membership.refused == {}


def test_revocation_lifted_by_claim_the_spread_calls_dead_members() -> None:
    def member(node_id: str, state: str, auth: str = "tls") -> SimpleNamespace:
        return SimpleNamespace(node_id=node_id, state=state, meta={"auth": auth}, is_self=False)

    members = [
        member("alive", "alive"),
        member("dead", "dead"),
        member("left", "left"),
        member("plain", "dead", "hmac"),
    ]
    runtime = SimpleNamespace(node_id="me", membership=SimpleNamespace(members=lambda: members))
    spread = CrlSpread(runtime, None, 1.0)  # type: ignore[arg-type]
    assert [m.node_id for m in spread._peers()] == ["alive", "dead"]


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(180)
async def test_revocation_lifted_by_claim_stays_until_a_certificate_that_is_not_revoked(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki", nodes=("a", "b", "c"))
    tls = {"crl_refresh_s": REFRESH_S}
    async with NodeDaemon(test_settings(tmp_path, "a", tls=pki.node_tls("a", **tls))) as a:
        seeds = [f"127.0.0.1:{a.port}"]
        b_settings = test_settings(tmp_path, "b", tls=pki.node_tls("b", **tls), seeds=seeds)
        c_settings = test_settings(tmp_path, "c", tls=pki.node_tls("c", **tls), seeds=seeds)
        async with NodeDaemon(b_settings) as b, NodeDaemon(c_settings) as c:
            assert b.crl_spread is not None
            assert b.runtime is not None
            membership = b.runtime.membership
            assert membership is not None

            def alive(node: NodeDaemon) -> bool:
                view = _view(node, "b")
                return view is not None and str(getattr(view, "state", "")) == "alive"

            await _until(lambda: alive(a) and alive(c), 20.0, "a and c to see b alive")
            revoke(pki.ca_dir, "b")
            (pki.root / "a" / "crl.pem").write_bytes(pki.ca_crl.read_bytes())
            await _until(lambda: _refused(a, "b") and _refused(c, "b"), 20.0, "b refused")
            # the thief: b's key and gossip key, advertising a made-up serial
            advertiser, b.crl_spread.revoked = b.crl_spread.revoked, None
            membership.update_meta({CERT_META: MADE_UP})
            await asyncio.sleep(4 * REFRESH_S + 2.0)  # gossip rounds, CRL rounds, applies
            assert _refused(a, "b"), "a claim lifted b's refusal at a"
            assert _refused(c, "b"), "a claim lifted b's refusal at c"
            # b given a new certificate: its calls (CRL fetches of members it sees dead)
            # present it, and that lifts the refusal
            pki.issue("b", CertRole.NODE)
            b.crl_spread.revoked = advertiser
            await _until(
                lambda: not _refused(a, "b") and not _refused(c, "b"),
                REFRESH_S + 20.0,
                "a and c to let b back once it presents a certificate that is not revoked",
            )
            await _until(lambda: alive(a) and alive(c), 20.0, "b alive again")
