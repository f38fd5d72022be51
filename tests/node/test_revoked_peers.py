"""RevokedPeers: the serial of each member comes from what it advertises and from what its calls
present, whichever was seen last; a member whose serial is on the CRL is refused, one that
advertises a new certificate stays refused until its call presents it (verified), and
certificates of non-members are not refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from config.tls import CertRole, TlsContexts, load_certificate, revoke, serial_text
from node.errors import MembershipError
from node.identity import CERT_META, RevokedPeers, tls_files
from node.identity.revoked import RefusingMembership
from tests.node.daemons import test_settings
from tests.node.tls_pki import make_pki


@dataclass
class View:
    node_id: str
    meta: Mapping[str, Any]
    is_self: bool = False


@dataclass
class FakeMembership:
    views: list[View]
    refused: dict[str, tuple[str, tuple[str, str] | None]] = field(default_factory=dict)

    def members(self) -> list[View]:
        return self.views

    def refuse(self, node_id: str, reason: str, mark: tuple[str, str] | None = None) -> None:
        self.refused[node_id] = (reason, mark)

    def allow(self, node_id: str) -> None:
        self.refused.pop(node_id, None)

    def update_meta(self, changes: Mapping[str, Any]) -> None:
        me = self.views[0]
        me.meta = MappingProxyType({**me.meta, **changes})


def test_members_with_revoked_serials_are_refused_and_let_back(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", nodes=("a", "b", "c", "d"))
    files = tls_files(test_settings(tmp_path, "a", tls=pki.node_tls("a")))
    assert files is not None
    contexts = TlsContexts(files)
    serial = {n: load_certificate(pki.cert(n)).serial_number for n in ("a", "b", "c", "alice")}
    membership = FakeMembership(
        [
            View("a", {}, is_self=True),
            View("b", {CERT_META: serial_text(serial["b"])}),
            View("c", {}),
            View("d", {CERT_META: "not hex"}),
        ]
    )
    assert isinstance(membership, RefusingMembership)
    book = RevokedPeers(contexts, "a")
    assert book.apply(membership) == {}
    assert membership.views[0].meta[CERT_META] == serial_text(serial["a"])  # advertised
    book.saw("c", serial["c"], verified=True)  # c's call presented its certificate
    book.saw("alice", serial["alice"], verified=True)
    for name in ("b", "c", "alice"):
        revoke(pki.ca_dir, name)
    assert contexts.install_crl(pki.ca_crl.read_bytes(), "test")
    refused = book.apply(membership)
    assert sorted(refused) == ["b", "c"]  # not alice (no member), not d (no serial)
    assert serial_text(serial["c"]) in refused["c"]
    assert refused["c"].startswith("revoked")
    assert membership.refused["b"][1] is None  # no mark: an advertised serial lifts nothing
    pki.issue("b", CertRole.NODE)
    fresh = load_certificate(pki.cert("b")).serial_number
    membership.views[1].meta = {CERT_META: serial_text(fresh)}  # b's new certificate
    assert sorted(book.apply(membership)) == ["b", "c"]  # advertised: a claim lifts nothing
    book.saw("b", fresh, verified=True)  # b's call presented it
    assert sorted(book.apply(membership)) == ["c"]
    assert sorted(membership.refused) == ["c"]
    book.saw("b", serial["b"], verified=False)  # ... but its calls present the revoked one
    assert sorted(book.apply(membership)) == ["b", "c"]


class FullMembership(FakeMembership):
    def update_meta(self, changes: Mapping[str, Any]) -> None:
        raise MembershipError("meta is too large to gossip; keep it under 600 bytes of JSON")


def test_a_serial_that_does_not_fit_the_meta_still_lets_revocations_apply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = make_pki(tmp_path / "pki", nodes=("a", "b"))
    files = tls_files(test_settings(tmp_path, "a", tls=pki.node_tls("a")))
    assert files is not None
    contexts = TlsContexts(files)
    book = RevokedPeers(contexts, "a")
    membership = FullMembership([View("a", {}, is_self=True), View("b", {})])
    book.saw("b", load_certificate(pki.cert("b")).serial_number, verified=True)
    revoke(pki.ca_dir, "b")
    assert contexts.install_crl(pki.ca_crl.read_bytes(), "test")
    assert sorted(book.apply(membership)) == ["b"]
    assert "cannot advertise certificate serial" in caplog.text
