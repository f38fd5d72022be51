"""Every error answer of every route of a running node has the one shape of config.wire."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from config import error_body, error_exception, error_response, load_settings, read_error
from node.cli.common import request_json
from node.daemon import NodeDaemon
from node.errors import JobError, KeyringRefused, LockError
from node.security import error_middleware
from sync import FILE_CATEGORIES
from tests.node.daemons import test_settings

SHAPE_KEYS = {"error", "reason", "status"}
OPTIONAL_KEYS = {"param", "index", "field", "path", "free_bytes", "fence", "retry_after_s"}
BAD_QUERY = "?limit=-1&ts=yesterday&after=&key=&path=../../etc/passwd&hash=zz&from=nobody"


def assert_shape(status: int, body: Any, where: str) -> None:
    assert isinstance(body, dict), f"{where}: {body!r}"
    assert body.keys() >= SHAPE_KEYS, f"{where}: {body!r}"
    assert isinstance(body["error"], str), where
    assert re.fullmatch(r"[a-z_]+", body["error"]), f"{where}: {body!r}"
    assert isinstance(body["reason"], str), f"{where}: {body!r}"
    assert body["reason"], f"{where}: {body!r}"
    assert body["status"] == status, f"{where}: {body!r}"
    assert body.keys() <= SHAPE_KEYS | OPTIONAL_KEYS, f"{where}: {body!r}"


KNOWN = {"store": "games", "category": FILE_CATEGORIES[0]}


def concrete(path: str, known: bool) -> str:
    """The path with every {param} replaced by a name this node knows (or does not)."""
    return re.sub(
        r"\{([^}]+)\}", lambda m: KNOWN.get(m.group(1), "x") if known else "no-such-thing", path
    )


async def operations(session: ClientSession, base: str) -> list[tuple[str, str]]:
    async with session.get(f"{base}/v1/openapi.json") as response:
        document = await response.json()
    return [(method.upper(), path) for path, item in document["paths"].items() for method in item]


async def test_every_route_answers_errors_in_one_shape(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "shape")) as daemon, ClientSession() as session:
        base = f"http://127.0.0.1:{daemon.port}"
        ops = await operations(session, base)
        assert len(ops) >= 15  # core, records, files, sync, election routes
        answered: dict[tuple[str, str], list[int]] = {}
        for method, path in ops:
            url, known = base + concrete(path, False), base + concrete(path, True)
            attempts = [
                (method, url + BAD_QUERY, b"{not json"),
                (method, known + BAD_QUERY, b"{not json"),
                (method, known, b"[1, 2"),
                (method, known, b'[{"game_id": 7}]'),
                (method, known, b'{"categories": 7, "from": 7, "path": 7, "term": "x"}'),
                ("PATCH", url, b""),  # a method no route takes
            ]
            for verb, target, body in attempts:
                headers = {"Content-Type": "application/json"}
                async with session.request(verb, target, data=body, headers=headers) as response:
                    if response.status < 400:
                        continue
                    assert response.content_type == "application/json", (verb, target)
                    assert_shape(response.status, await response.json(), f"{verb} {target}")
                    answered.setdefault((method, path), []).append(response.status)
        assert set(answered) == set(ops)
        # the bad requests really reached the handlers, not only the router
        statuses = {status for found in answered.values() for status in found}
        assert {400, 404, 405} <= statuses, statuses
        async with session.get(f"{base}/v1/records/no-such-thing/since") as response:
            body = await response.json()
            assert (response.status, body["error"]) == (404, "unknown_store")


async def test_unsigned_requests_get_401_in_the_one_shape(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    secret.chmod(0o600)
    settings = test_settings(tmp_path, "signed", secret_file=secret)
    async with NodeDaemon(settings) as daemon, ClientSession() as session:
        base = f"http://127.0.0.1:{daemon.port}"
        async with session.get(f"{base}/v1/health") as response:
            assert response.status in (200, 503)
        for method, path in [("GET", "/v1/status"), ("POST", "/v1/records/games")]:
            async with session.request(method, base + path, data=b"[]") as response:
                body = await response.json()
                assert_shape(401, body, path)
                assert body["error"] == "unauthorized"
                assert "missing signature headers" in body["reason"]


def test_the_helpers_build_and_read_the_shape() -> None:
    assert error_body(409, "stale plan", index=None, param="ts") == {
        "error": "conflict",
        "reason": "stale plan",
        "status": 409,
        "param": "ts",
    }
    response = error_response(503, "busy", "busy", retry_after_s=0.2)
    assert (response.status, response.headers["Retry-After"]) == (503, "1")
    raised = error_exception(507, "full", path="/d", free_bytes=0)
    assert isinstance(raised, web.HTTPInsufficientStorage)
    assert raised.text is not None
    answer = read_error(507, raised.text)
    assert (answer.code, answer.reason, answer.extra) == (
        "insufficient_storage",
        "full",
        {"path": "/d", "free_bytes": 0},
    )
    assert read_error(502, b"<html>bad gateway</html>").reason == "<html>bad gateway</html>"
    assert read_error(409, b'{"error": "old shape"}').reason == "old shape"


async def test_an_unexpected_exception_is_a_500_in_the_one_shape() -> None:
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/v1/broken", broken)
    async with (
        TestServer(app, host="127.0.0.1") as server,
        ClientSession() as session,
        session.get(server.make_url("/v1/broken")) as response,
    ):
        body = await response.json()
    assert_shape(500, body, "GET /v1/broken")
    assert body["error"] == "internal_error"
    assert "a bug" not in body["reason"]  # details go to the log, not to the caller


async def test_cli_prints_the_nodes_reason(capsys: pytest.CaptureFixture[str]) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return error_response(409, "no role plan yet: no coordinator has published one", "no_plan")

    app = web.Application()
    app.router.add_get("/v1/rendezvous", refuse)
    settings = load_settings(env={}).settings
    async with TestServer(app, host="127.0.0.1") as server:
        url = str(server.make_url("/v1/rendezvous"))
        with pytest.raises(typer.Exit) as exit_info:
            await request_json(settings, "GET", url)
    assert exit_info.value.exit_code == 1
    err = capsys.readouterr().err
    assert f"{url}: HTTP 409: no role plan yet: no coordinator has published one (no_plan)" in err


async def test_the_middleware_answers_every_answered_error_with_its_status_and_code() -> None:
    refusals = {
        "/v1/lock": LockError(503, "no_lock_quorum", "no quorum of voters"),
        "/v1/job": JobError(404, "job_not_found", "no job 'x' on this node"),
        "/v1/keyring": KeyringRefused(409, "key_in_use", "key k is in use"),
        "/v1/keyring/busy": KeyringRefused(503, "not_coordinator", "no coordinator yet; retry"),
    }

    async def refuse(request: web.Request) -> web.Response:
        raise refusals[request.path]

    app = web.Application(middlewares=[error_middleware])
    for path in refusals:
        app.router.add_get(path, refuse)
    async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:
        for path, refusal in refusals.items():
            async with session.get(server.make_url(path)) as response:
                body = await response.json()
                retry_after = response.headers.get("Retry-After")
            assert_shape(refusal.status, body, path)
            assert (body["error"], body["reason"]) == (refusal.code, refusal.reason)
            assert retry_after == ("1" if refusal.status == 503 else None), path
