"""The CRL spreads: a revocation put on one node reaches its peers over mutual TLS within
`tls.crl_refresh_s`, the highest CRL number signed by the CA wins, a CRL of another CA is
ignored, and an older number never replaces a newer one."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from config import AuthMode
from config.tls import CertRole, TlsContexts, init_ca, revoke
from node.daemon import NodeDaemon
from node.identity import CRL_NUMBER_HEADER, CRL_PATH, peer_scheme, tls_files
from tests.node.daemons import test_settings
from tests.node.tls_pki import make_pki


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


async def _status(port: int, context: ssl.SSLContext, host: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"https://127.0.0.1:{port}/v1/status", ssl=context, server_hostname=host
        ) as response,
    ):
        return response.status, await response.json(content_type=None)


async def test_a_revocation_on_one_node_reaches_the_other(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    refresh = {"crl_refresh_s": 0.2}
    a_settings = test_settings(tmp_path, "a", tls=pki.node_tls("a", **refresh))
    async with NodeDaemon(a_settings) as a:
        b_settings = test_settings(
            tmp_path, "b", tls=pki.node_tls("b", **refresh), seeds=[f"127.0.0.1:{a.port}"]
        )
        async with NodeDaemon(b_settings) as b:
            assert a.tls is not None
            assert b.tls is not None
            assert b.crl_spread is not None

            def sees_a() -> bool:
                assert b.runtime is not None
                assert b.runtime.membership is not None
                return any(
                    m.node_id == "a" and m.meta.get("auth") == "tls"
                    for m in b.runtime.membership.members()
                )

            await _until(sees_a, 10.0, "b sees a (with its auth mode)")
            status, body = await _status(b.port, pki.client("alice"), "b")
            assert status == 200, body
            fetched = b.crl_spread.fetches
            await _until(lambda: b.crl_spread.fetches > fetched, 5.0, "b asks a for its CRL")  # type: ignore[union-attr]
            assert b.tls.material.crl_number == 0
            revoke(pki.ca_dir, "alice")
            shutil.copyfile(pki.ca_crl, pki.root / "a" / "crl.pem")  # given to a only
            await _until(lambda: a.tls.material.crl_number == 1, 10.0, "a loads the CRL")  # type: ignore[union-attr]
            await _until(lambda: b.tls.material.crl_number == 1, 10.0, "b learns it from a")  # type: ignore[union-attr]
            assert (pki.root / "b" / "crl.pem").read_bytes() == pki.ca_crl.read_bytes()
            status, body = await _status(b.port, pki.client("alice"), "b")
            assert status == 401, body
            assert body["refusal"] == "revoked"
            assert body["identity"] == "alice"
            # the route itself: newer than `after` or 204
            async with aiohttp.ClientSession() as session:
                url = f"https://127.0.0.1:{a.port}{CRL_PATH}"
                context = pki.client("b")
                async with session.get(
                    url, params={"after": "0"}, ssl=context, server_hostname="a"
                ) as response:
                    assert response.status == 200
                    assert response.headers[CRL_NUMBER_HEADER] == "1"
                async with session.get(
                    url, params={"after": "1"}, ssl=context, server_hostname="a"
                ) as response:
                    assert response.status == 204


def test_the_newest_crl_of_the_ca_wins(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", nodes=("a",))
    settings = test_settings(tmp_path, "a", tls=pki.node_tls("a"))
    files = tls_files(settings)
    assert files is not None
    contexts = TlsContexts(files)
    old = pki.ca_crl.read_bytes()
    revoke(pki.ca_dir, "alice")
    newer = pki.ca_crl.read_bytes()
    assert contexts.install_crl(newer, "peer-1")
    assert contexts.material.crl_number == 1
    assert files.crl.read_bytes() == newer
    assert not contexts.install_crl(old, "peer-2")  # older: ignored
    assert contexts.material.crl_number == 1
    init_ca(tmp_path / "other")
    for name in ("zed", "zoe", "zak"):
        pki.issue(name, CertRole.OPERATOR, ca_dir=tmp_path / "other")
        revoke(tmp_path / "other", name)
    foreign = (tmp_path / "other" / "crl.pem").read_bytes()  # number 3, of another CA
    assert not contexts.install_crl(foreign, "mallory")
    assert not contexts.install_crl(b"not a crl", "mallory")
    assert contexts.material.crl_number == 1


@pytest.mark.parametrize(
    ("own", "peer", "scheme"),
    [
        (AuthMode.TLS, None, "https"),
        (AuthMode.TLS, "hmac+tls", "https"),
        (AuthMode.HMAC_TLS, "tls", "https"),
        (AuthMode.HMAC_TLS, "hmac+tls", "https"),
        (AuthMode.HMAC_TLS, None, "http"),
        (AuthMode.HMAC, "tls", "http"),
    ],
)
def test_peer_scheme(own: AuthMode, peer: str | None, scheme: str) -> None:
    assert peer_scheme(own, peer) == scheme


def test_a_failed_reload_keeps_the_material_in_use(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", nodes=("a",))
    files = tls_files(test_settings(tmp_path, "a", tls=pki.node_tls("a")))
    assert files is not None
    contexts = TlsContexts(files)
    before = contexts.material
    good = files.cert.read_bytes()
    files.cert.write_bytes(good[: len(good) // 2])  # a half-copied certificate
    assert contexts.changed()
    assert not contexts.reload_if_changed()
    assert contexts.material is before
    assert contexts.server_context() is before.server
    assert "tls.cert" in contexts.reload_errors[-1]
    assert str(files.cert) in contexts.reload_errors[-1]
    files.cert.write_bytes(good)
    assert contexts.reload("SIGHUP")
    assert contexts.material.generation == before.generation + 1
    assert contexts.reload_errors == []
