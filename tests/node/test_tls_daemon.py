"""A daemon with `auth: tls`: TLS 1.3 only, a client certificate for every route but health,
the OpenAPI document and /metrics; the certificate's role decides what the caller may do;
refused certificates name the identity and reason and are counted; the material reloads when
its files change and on SIGHUP; plain HTTP is refused (served from loopback only when signed)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import typer

import config.tls.section
from config import ConfigError, signing_middleware
from config.tls import (
    CertRole,
    RefusalReason,
    TlsContexts,
    client_scheme,
    handshake_refusal,
    init_ca,
    load_certificate,
    operator_context,
    revoke,
)
from node.cli.common import node_url, request_json
from node.daemon import NodeDaemon
from node.identity import tls_files
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.tls_pki import Pki, make_pki

SECRET = b"tls-daemon-test-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True, params=[0, 2], ids=["loop-tls", "tls-workers"])
def tls_workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Every test twice: the daemon's loop terminates TLS (`tls.workers: 0`), and two worker
    threads do (node.identity.terminator), as the default gives a host of 8 CPUs."""
    count = int(request.param)
    monkeypatch.setattr(config.tls.section, "default_tls_workers", lambda cpus: count)
    return count


async def test_tls_workers_run_while_the_daemon_does_and_stop_with_it(
    tmp_path: Path, pki: Pki, tls_workers: int
) -> None:
    def workers() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("api-tls-")]

    async with NodeDaemon(_settings(tmp_path, pki)) as daemon:
        assert daemon.settings.tls is not None
        assert daemon.settings.tls.worker_count == tls_workers
        assert sorted(workers()) == [f"api-tls-{index}" for index in range(tls_workers)]
        status, body = await _call(daemon.port, pki.client("alice"), "GET", "/v1/status")
        assert status == 200, body
        status, body = await _call(daemon.port, pki.client("alice"), "GET", "/v1/health")
        assert status == 200, body
        assert ('"tls_workers"' in json.dumps(body)) is (tls_workers > 0)
    assert workers() == []


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


async def _call(
    port: int,
    context: ssl.SSLContext,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            f"https://127.0.0.1:{port}{path}",
            json=body,
            headers=headers,
            ssl=context,
            server_hostname="a",
        ) as response,
    ):
        text = await response.text()
        try:
            return response.status, await response.json(content_type=None)
        except ValueError:
            return response.status, text


def _refused(daemon: NodeDaemon, reason: str) -> float:
    assert daemon.runtime is not None
    assert daemon.runtime.metrics is not None
    value = daemon.runtime.metrics.registry.get_sample_value(
        "shoal_tls_refused_total", {"reason": reason}
    )
    return value or 0.0


def _settings(tmp_path: Path, pki: Pki, **flags: Any) -> Any:
    return test_settings(tmp_path, "a", tls=pki.node_tls("a"), **flags)


async def test_tls_13_and_a_certificate_for_every_route_but_the_public_ones(
    tmp_path: Path, pki: Pki
) -> None:
    async with NodeDaemon(_settings(tmp_path, pki)) as daemon:
        assert daemon.settings.auth_mode.value == "tls"
        anonymous = pki.client(None)
        for path in ("/v1/health", "/v1/openapi.json"):
            status, _ = await _call(daemon.port, anonymous, "GET", path)
            assert status == 200, path
        status, body = await _call(daemon.port, anonymous, "GET", "/v1/status")
        assert status == 401, body
        assert body["error"] == "certificate_required"
        assert _refused(daemon, "no_certificate") == 1
        status, body = await _call(daemon.port, anonymous, "GET", "/metrics")
        assert status == 401, body  # /metrics keeps its token: none given
        status, body = await _call(daemon.port, pki.client("alice"), "GET", "/v1/status")
        assert status == 200, body
        # the handshake is TLS 1.3 and the server is node a's certificate
        _reader, writer = await asyncio.open_connection(
            "127.0.0.1", daemon.port, ssl=pki.client("alice"), server_hostname="a"
        )
        ssl_object = writer.get_extra_info("ssl_object")
        assert ssl_object.version() == "TLSv1.3"
        served = ssl_object.getpeercert()
        assert dict(part[0] for part in served["subject"])["commonName"] == "a"
        writer.close()
        await writer.wait_closed()
        # TLS 1.2 is refused
        old = pki.client("alice")
        old.minimum_version = ssl.TLSVersion.TLSv1_2
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((ssl.SSLError, aiohttp.ClientError)):
            await _call(daemon.port, old, "GET", "/v1/status")
        # plain HTTP is refused (no secret: not even from loopback)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{daemon.port}/v1/health") as response,
        ):
            assert response.status == 400
            assert "HTTPS only" in await response.text()


async def test_the_certificate_names_the_caller_not_a_header(tmp_path: Path, pki: Pki) -> None:
    async with NodeDaemon(_settings(tmp_path, pki)) as daemon:
        status, body = await _call(
            daemon.port,
            pki.client("alice"),
            "POST",
            "/v1/jobs",
            {"name": "who", "argv": ["true"]},
            headers={"X-Shoal-Node": "b"},
        )
        assert status in (200, 201), body
        status, audit = await _call(daemon.port, pki.client("alice"), "GET", "/v1/audit")
        assert status == 200, audit
        senders = [entry["sender"] for entry in audit["entries"]]
        assert "alice" in senders, audit
        assert "b" not in senders


async def test_a_node_certificate_may_not_start_a_job(tmp_path: Path, pki: Pki) -> None:
    async with NodeDaemon(_settings(tmp_path, pki)) as daemon:
        status, body = await _call(
            daemon.port, pki.client("b"), "POST", "/v1/jobs", {"name": "x", "argv": ["true"]}
        )
        assert status == 403, body
        assert body["error"] == "forbidden"
        assert body["status"] == 403
        assert "role node" in body["reason"]
        assert (body["identity"], body["role"]) == ("b", "node")
        # a fence of another plan than the node's: refused too (409 with both fences)
        status, body = await _call(
            daemon.port,
            pki.client("b"),
            "POST",
            "/v1/jobs",
            {"name": "x", "argv": ["true"]},
            headers={"X-Shoal-Fence": "99.1"},
        )
        assert status == 409, body
        # peer calls are allowed: an election vote request reaches its handler (not 403)
        status, body = await _call(daemon.port, pki.client("b"), "POST", "/v1/election/vote", {})
        assert status != 403, body
        status, body = await _call(daemon.port, pki.client("b"), "POST", "/v1/runs", {})
        assert status == 403, body
        registry = daemon.runtime.metrics.registry  # type: ignore[union-attr]
        assert registry.get_sample_value("shoal_role_refused_total", {"role": "node"}) == 2


def _concrete(path: str) -> str:
    return path.replace("{", "x").replace("}", "")


async def test_a_reader_gets_403_on_every_non_get_route_and_an_operator_does_not(
    tmp_path: Path, pki: Pki
) -> None:
    async with NodeDaemon(_settings(tmp_path, pki)) as daemon:
        status, document = await _call(daemon.port, pki.client(None), "GET", "/v1/openapi.json")
        assert status == 200
        walked = 0
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                if method.upper() in ("GET", "HEAD", "OPTIONS"):
                    continue
                if operation["x-shoal-callers"] == ["public"]:
                    continue  # the dashboard's login: no credential needed
                status, body = await _call(
                    daemon.port, pki.client("rita"), method.upper(), _concrete(path), {}
                )
                assert status == 403, (method, path, body)
                assert body["error"] == "forbidden"
                assert "role reader" in body["reason"]
                walked += 1
        assert walked >= 20
        status, body = await _call(
            daemon.port, pki.client("alice"), "POST", "/v1/jobs", {"name": "x", "argv": ["true"]}
        )
        assert status in (200, 201), body
        status, body = await _call(daemon.port, pki.client("rita"), "GET", "/v1/jobs")
        assert status == 200, body


@pytest.mark.parametrize("reason", ["expired", "not_yet_valid", "revoked", "other_ca"])
async def test_a_refused_certificate_is_named_with_its_reason_and_counted(
    tmp_path: Path, pki: Pki, reason: str
) -> None:
    local = Pki(tmp_path / "pki")
    local.root.mkdir()
    init_ca(local.ca_dir)
    local.issue("a", CertRole.NODE)
    now = datetime.now(UTC)
    if reason == "expired":
        local.issue("old", CertRole.OPERATOR, days=1, now=now - timedelta(days=3))
    elif reason == "not_yet_valid":
        local.issue("old", CertRole.OPERATOR, days=5, now=now + timedelta(days=2))
    elif reason == "revoked":
        local.issue("old", CertRole.OPERATOR)
        revoke(local.ca_dir, "old")
    else:
        init_ca(local.root / "other")
        local.issue("old", CertRole.OPERATOR, ca_dir=local.root / "other")
    settings = test_settings(tmp_path, "a", tls=local.node_tls("a"))
    async with NodeDaemon(settings) as daemon:
        if reason == "other_ca":
            with pytest.raises((ssl.SSLError, aiohttp.ClientError)):
                await _call(daemon.port, local.client("old"), "GET", "/v1/status")
        else:
            status, body = await _call(daemon.port, local.client("old"), "GET", "/v1/status")
            assert status == 401, body
            assert body["error"] == "certificate_refused"
            assert body["refusal"] == reason
            assert body["identity"] == "old"
            assert f"certificate 'old' refused ({reason})" in body["reason"]
        await _until(lambda: _refused(daemon, reason) >= 1, 5.0, f"{reason} counted")


async def test_the_material_reloads_when_its_files_change_and_on_sighup(
    tmp_path: Path,
) -> None:
    local = Pki(tmp_path / "pki")
    local.root.mkdir()
    init_ca(local.ca_dir)
    local.issue("a", CertRole.NODE)
    local.issue("alice", CertRole.OPERATOR)
    settings = test_settings(tmp_path, "a", tls=local.node_tls("a"))

    async def served_serial(port: int) -> int:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=local.client("alice"), server_hostname="a"
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
        from cryptography import x509

        return int(x509.load_der_x509_certificate(der).serial_number)

    async with NodeDaemon(settings) as daemon:
        assert daemon.tls is not None
        first = await served_serial(daemon.port)
        assert first == load_certificate(local.cert("a")).serial_number
        local.issue("a", CertRole.NODE)  # a new certificate and key in the same files
        second = load_certificate(local.cert("a")).serial_number
        assert second != first
        await _until(lambda: daemon.tls.material.own.serial == second, 10.0, "reload")  # type: ignore[union-attr]
        assert await served_serial(daemon.port) == second
        # revoke alice and put the CRL in place: the next request of alice is refused
        revoke(local.ca_dir, "alice")
        (local.root / "a" / "crl.pem").write_bytes(local.ca_crl.read_bytes())
        await _until(lambda: daemon.tls.material.crl_number == 1, 10.0, "CRL reload")  # type: ignore[union-attr]
        status, body = await _call(daemon.port, local.client("alice"), "GET", "/v1/status")
        assert status == 401, body
        assert body["refusal"] == "revoked", body
        # SIGHUP reloads too (the file watch sees nothing new)
        assert daemon.crl_spread is not None
        assert daemon.crl_spread.handles_sighup
        generation = daemon.tls.material.generation
        os.kill(os.getpid(), signal.SIGHUP)
        await _until(
            lambda: daemon.tls.material.generation == generation + 1,  # type: ignore[union-attr]
            5.0,
            "SIGHUP reload",
        )


async def test_loopback_plain_http_is_served_only_when_signed(tmp_path: Path, pki: Pki) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    async with NodeDaemon(_settings(tmp_path, pki, secret_file=secret)) as daemon:
        url = f"http://127.0.0.1:{daemon.port}/v1/status"
        async with (
            aiohttp.ClientSession(middlewares=(signing_middleware(SECRET, "cli-test"),)) as s,
            s.get(url) as response,
        ):
            assert response.status == 200
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 401
        # over TLS a signature is no identity with auth tls: a certificate is needed
        status, body = await _call(daemon.port, pki.client(None), "GET", "/v1/status")
        assert status == 401, body
        assert body["error"] == "certificate_required", body


async def test_hmac_plus_tls_accepts_both(tmp_path: Path, pki: Pki) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    settings = _settings(tmp_path, pki, secret_file=secret, auth="hmac+tls")
    async with NodeDaemon(settings) as daemon:
        status, body = await _call(daemon.port, pki.client("alice"), "GET", "/v1/status")
        assert status == 200, body
        url = f"http://127.0.0.1:{daemon.port}/v1/status"
        async with (
            aiohttp.ClientSession(middlewares=(signing_middleware(SECRET, "cli-test"),)) as s,
            s.get(url) as response,
        ):
            assert response.status == 200
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 401


def test_bad_tls_files_stop_the_daemon_naming_the_setting_and_file(
    tmp_path: Path, pki: Pki
) -> None:
    missing = tmp_path / "nope.crt"
    tls = {**pki.node_tls("a"), "cert": str(missing)}
    with pytest.raises(ConfigError) as caught:
        asyncio.run(NodeDaemon(test_settings(tmp_path, "a", tls=tls)).start())
    assert "tls.cert" in str(caught.value)
    assert str(missing) in str(caught.value)
    tls = {**pki.node_tls("a"), "key": str(pki.key("b"))}
    with pytest.raises(ConfigError) as caught:
        asyncio.run(NodeDaemon(test_settings(tmp_path, "a", tls=tls)).start())
    assert "tls.key" in str(caught.value)
    assert str(pki.key("b")) in str(caught.value)
    tls = {**pki.node_tls("a"), "cert": str(pki.cert("alice")), "key": str(pki.key("alice"))}
    with pytest.raises(ConfigError) as caught:
        asyncio.run(NodeDaemon(test_settings(tmp_path, "alice", tls=tls)).start())
    assert "operator certificate" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        asyncio.run(NodeDaemon(test_settings(tmp_path, "c", tls=pki.node_tls("a"))).start())
    assert "names 'a'" in str(caught.value)


def test_the_client_certificate_of_a_command_comes_from_the_environment(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert operator_context({}) is None
    with pytest.raises(ConfigError, match="SHOAL_TLS_KEY, SHOAL_TLS_CA not set"):
        operator_context({"SHOAL_TLS_CERT": str(pki.cert("alice"))})
    wrong = {
        "SHOAL_TLS_CERT": str(pki.cert("alice")),
        "SHOAL_TLS_KEY": str(pki.key("rita")),
        "SHOAL_TLS_CA": str(pki.ca_cert),
    }
    with pytest.raises(ConfigError, match="SHOAL_TLS_CERT, SHOAL_TLS_KEY"):
        operator_context(wrong)
    assert client_scheme("http://h:1", None) == "http://h:1"
    assert client_scheme("http://h:1", ssl.create_default_context()) == "https://h:1"


async def test_a_command_presents_the_operator_certificate(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOAL_TLS_CERT", str(pki.cert("alice")))
    monkeypatch.setenv("SHOAL_TLS_KEY", str(pki.key("alice")))
    monkeypatch.setenv("SHOAL_TLS_CA", str(pki.ca_cert))
    async with NodeDaemon(_settings(tmp_path, pki)) as daemon:
        url = node_url(daemon.settings, f"http://127.0.0.1:{daemon.port}")
        assert url.startswith("https://")
        status = await request_json(daemon.settings, "GET", f"{url}/v1/status")
        assert status["node_id"] == "a"
        job = await request_json(
            daemon.settings, "POST", f"{url}/v1/jobs", {"name": "x", "argv": ["true"]}
        )
        assert job["argv"] == ["true"]
        monkeypatch.setenv("SHOAL_TLS_CERT", str(pki.cert("rita")))
        monkeypatch.setenv("SHOAL_TLS_KEY", str(pki.key("rita")))
        with pytest.raises(typer.Exit):
            await request_json(
                daemon.settings, "POST", f"{url}/v1/jobs", {"name": "x", "argv": ["true"]}
            )


async def test_a_node_certificate_starts_a_job_with_the_current_plans_fence(
    tmp_path: Path, pki: Pki
) -> None:
    settings = _settings(tmp_path, pki, voters=["a"], **FAST_ELECTION)
    async with NodeDaemon(settings) as daemon:
        runtime = daemon.runtime
        assert runtime is not None

        def planned() -> bool:
            runtime.refresh()
            return runtime.plan_version is not None and runtime.term is not None

        await _until(planned, 10.0, "a plan")
        fence = f"{runtime.term}.{runtime.plan_version}"
        status, body = await _call(
            daemon.port,
            pki.client("b"),
            "POST",
            "/v1/jobs",
            {"name": "member", "argv": ["true"]},
            headers={"X-Shoal-Fence": fence},
        )
        assert status in (200, 201), body


async def test_a_file_is_served_whole_and_in_ranges_over_tls(tmp_path: Path, pki: Pki) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)
    settings = _settings(tmp_path, pki)
    models = settings.data_dir / "models"
    models.mkdir(parents=True)
    (models / "w.bin").write_bytes(data)
    async with NodeDaemon(settings) as daemon:
        url = f"https://127.0.0.1:{daemon.port}/v1/sync/models/file"
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 20
            while True:
                async with session.get(
                    url, params={"path": "w.bin"}, ssl=pki.client("alice"), server_hostname="a"
                ) as response:
                    if response.status == 200:
                        assert await response.read() == data
                        break
                assert time.monotonic() < deadline, response.status
                await asyncio.sleep(0.1)
            async with session.get(
                url,
                params={"path": "w.bin"},
                headers={"Range": "bytes=1048570-2097160"},
                ssl=pki.client("alice"),
                server_hostname="a",
            ) as response:
                assert response.status == 206
                assert await response.read() == data[1048570:2097161]


async def test_the_client_context_refuses_a_revoked_or_misnamed_server(tmp_path: Path) -> None:
    local = Pki(tmp_path / "pki")
    local.root.mkdir()
    init_ca(local.ca_dir)
    local.issue("a", CertRole.NODE)
    local.issue("b", CertRole.NODE)
    async with NodeDaemon(test_settings(tmp_path, "a", tls=local.node_tls("a"))) as daemon:
        b_files = tls_files(test_settings(tmp_path, "b", tls=local.node_tls("b")))
        assert b_files is not None
        b = TlsContexts(b_files)

        async def handshake(name: str) -> tuple[RefusalReason, str] | None:
            try:
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", daemon.port, ssl=b.client_context(), server_hostname=name
                )
            except ssl.SSLError as exc:
                return handshake_refusal(exc)
            writer.close()
            await writer.wait_closed()
            return None

        assert await handshake("a") is None
        refusal = await handshake("c")
        assert refusal is not None
        assert refusal[0] is RefusalReason.BAD_IDENTITY
        revoke(local.ca_dir, "a")
        assert b.install_crl(local.ca_crl.read_bytes(), "test")
        refusal = await handshake("a")
        assert refusal is not None
        assert refusal[0] is RefusalReason.REVOKED, refusal


async def test_cluster_monitor_reads_a_tls_node_with_a_reader_certificate(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    from health.monitor.client import ClusterMonitor

    async with NodeDaemon(_settings(tmp_path, pki)) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"
        async with ClusterMonitor([url], timeout_s=5.0) as plain:
            row = (await plain.get_cluster_status()).nodes[0]
            assert row.error is not None, "a TLS node does not answer plain HTTP from a monitor"
        monkeypatch.setenv("SHOAL_TLS_CERT", str(pki.cert("rita")))
        monkeypatch.setenv("SHOAL_TLS_KEY", str(pki.key("rita")))
        monkeypatch.setenv("SHOAL_TLS_CA", str(pki.ca_cert))
        async with ClusterMonitor([url], timeout_s=5.0) as monitor:
            status = await monitor.get_cluster_status()
            assert [(n.node_id, n.error) for n in status.nodes] == [("a", None)]
