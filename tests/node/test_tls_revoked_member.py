"""A node whose certificate is revoked leaves the membership: within crl_refresh_s + 10 s every
peer shows it dead and refused (it still holds the gossip key, but its datagrams are dropped and
its refutations ignored), cluster_monitor shows it so, and its own calls fail naming the reason."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from config.tls import revoke, serial_text
from health.monitor.client import ClusterMonitor
from node.daemon import NodeDaemon
from node.identity import CERT_META
from tests.node.daemons import test_settings
from tests.node.tls_pki import Pki, make_pki

REFRESH_S = 0.5


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


def _view(daemon: NodeDaemon, node_id: str) -> object | None:
    assert daemon.runtime is not None
    assert daemon.runtime.membership is not None
    return next((m for m in daemon.runtime.membership.members() if m.node_id == node_id), None)


def _refused(daemon: NodeDaemon, node_id: str) -> bool:
    view = _view(daemon, node_id)
    return (
        view is not None
        and str(getattr(view, "state", "")) == "dead"
        and str(getattr(view, "refused", "")).startswith("revoked")
    )


async def _status_as(pki: Pki, name: str, port: int, host: str) -> tuple[int, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"https://127.0.0.1:{port}/v1/status", ssl=pki.client(name), server_hostname=host
        ) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


@pytest.mark.timeout(120)
async def test_a_revoked_node_shows_dead_and_refused_at_every_peer_and_in_the_monitor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path / "pki", nodes=("a", "b", "c"))
    tls = {"crl_refresh_s": REFRESH_S}
    async with NodeDaemon(test_settings(tmp_path, "a", tls=pki.node_tls("a", **tls))) as a:
        seeds = [f"127.0.0.1:{a.port}"]
        b_settings = test_settings(tmp_path, "b", tls=pki.node_tls("b", **tls), seeds=seeds)
        c_settings = test_settings(tmp_path, "c", tls=pki.node_tls("c", **tls), seeds=seeds)
        async with NodeDaemon(b_settings) as b, NodeDaemon(c_settings) as c:
            assert b.tls is not None
            b_serial = serial_text(b.tls.material.own.serial)

            def all_know_b() -> bool:
                views = [_view(d, "b") for d in (a, c)]
                return all(
                    v is not None
                    and str(getattr(v, "state", "")) == "alive"
                    and getattr(v, "meta", {}).get(CERT_META) == b_serial
                    for v in views
                )

            await _until(all_know_b, 15.0, "a and c to know b alive with its certificate serial")
            revoke(pki.ca_dir, "b")
            shutil.copyfile(pki.ca_crl, pki.root / "a" / "crl.pem")  # given to a only
            revoked_at = time.monotonic()
            await _until(
                lambda: _refused(a, "b") and _refused(c, "b"),
                REFRESH_S + 10.0,
                "a and c to refuse b",
            )

            assert time.monotonic() - revoked_at <= REFRESH_S + 10.0
            await asyncio.sleep(2 * REFRESH_S + 1.0)  # b keeps pinging and refuting: unheard
            assert _refused(a, "b")
            assert _refused(c, "b")
            assert _view(a, "c") is not None
            assert str(getattr(_view(a, "c"), "state", "")) == "alive"
            status, body = await _status_as(pki, "b", c.port, "c")  # b's own calls
            assert status == 401, body
            assert body["refusal"] == "revoked"
            assert body["identity"] == "b"
            monkeypatch.setenv("SHOAL_TLS_CERT", str(pki.cert("rita")))
            monkeypatch.setenv("SHOAL_TLS_KEY", str(pki.key("rita")))
            monkeypatch.setenv("SHOAL_TLS_CA", str(pki.ca_cert))
            urls = [f"http://127.0.0.1:{d.port}" for d in (a, c)]
            async with ClusterMonitor(urls, timeout_s=5.0) as monitor:
                rows = {row.node_id: row for row in (await monitor.get_cluster_status()).nodes}
            assert rows["b"].state == "dead", rows["b"]
            assert rows["b"].refused is not None
            assert b_serial in rows["b"].refused
            assert rows["b"].failing
            assert rows["a"].state == "alive"
            assert rows["a"].refused is None
            assert rows["b"].to_dict()["refused"] == rows["b"].refused
            # the dashboard's members topic, read with the reader certificate
            url = f"https://127.0.0.1:{a.port}/v1/events?topics=members"
            async with (
                aiohttp.ClientSession() as session,
                session.get(url, ssl=pki.client("rita"), server_hostname="a") as answer,
            ):
                assert answer.status == 200, await answer.text()
                async for line in answer.content:
                    if line.startswith(b"data: {"):
                        members = {m["node_id"]: m for m in json.loads(line[6:])["members"]}
                        break
            assert members["b"]["state"] == "dead"
            assert members["b"]["refused"].startswith("revoked")
            assert members["c"]["refused"] is None
            # its datagrams are counted as dropped
            async with (
                aiohttp.ClientSession() as session,
                session.get(
                    f"https://127.0.0.1:{a.port}/metrics",
                    ssl=pki.client("rita"),
                    server_hostname="a",
                ) as answer,
            ):
                assert answer.status == 200, await answer.text()
                scraped = await answer.text()
            assert 'shoal_membership_datagrams_dropped_total{reason="refused_sender"}' in scraped
