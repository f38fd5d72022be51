"""The OpenAPI document is the contract: valid OpenAPI 3.1 (openapi-spec-validator), a schema for
every parameter, body and answer, and a live daemon that schemathesis cannot make fail a check.

The fuzz runs the schemathesis CLI (a client nobody here wrote) against `shoal serve` in its own
process on loopback, with every check on and the settings of tests/node/schemathesis.toml.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from openapi_spec_validator import validate

from node.daemon import NodeDaemon
from tests.node.daemons import test_settings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
PUBLIC = {
    ("GET", "/v1/health"),
    ("GET", "/v1/openapi.json"),
    # the dashboard's login and assets hold no data (node/ui); its data is /v1/events
    ("GET", "/ui/login"),
    ("POST", "/ui/login"),
    ("GET", "/ui/assets/{name}"),
}
UNSIGNED_OK = {*PUBLIC, ("GET", "/ui/")}
"""Answered without a signature: the public routes, and the dashboard's page (a redirect to the
login page without its session)."""
HEADERS = {"X-Shoal-Node", "X-Shoal-Timestamp", "X-Shoal-Nonce", "X-Shoal-Signature"}
START_LIVENESS_S = 60.0
FUZZ_LIVENESS_S = 900.0
EXAMPLES_PER_OPERATION = 60
SIGNED_EXAMPLES_PER_OPERATION = 10


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    secret.chmod(0o600)
    return secret


async def _document(tmp_path: Path, signed: bool) -> dict[str, Any]:
    flags: dict[str, Any] = {"secret_file": _secret(tmp_path)} if signed else {}
    name = "signed" if signed else "open"
    async with NodeDaemon(test_settings(tmp_path, name, **flags)) as daemon:
        url = f"http://127.0.0.1:{daemon.port}/v1/openapi.json"
        # no signature: the document holds no secret and is served to anyone
        async with ClientSession() as session, session.get(url) as response:
            assert response.status == 200, await response.text()
            document: dict[str, Any] = await response.json()
            return document


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield method.upper(), path, operation


@pytest.mark.parametrize("signed", [False, True], ids=["no-secret", "secret"])
async def test_the_document_is_valid_openapi_31_with_a_schema_everywhere(
    tmp_path: Path, signed: bool
) -> None:
    document = await _document(tmp_path, signed)
    validate(document)  # raises with the first violation
    assert document["openapi"] == "3.1.0"
    operations = list(_operations(document))
    assert len(operations) >= 18
    for method, path, operation in operations:
        where = f"{method} {path}"
        for parameter in operation.get("parameters", ()):
            assert "schema" in parameter, f"{where}: parameter {parameter['name']}"
        for match in re.finditer(r"\{([^}]+)\}", path):
            names = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "path"}
            assert match.group(1) in names, where
        for status, answer in operation["responses"].items():
            if status.startswith("3") or status == "204":
                assert "content" not in answer, f"{where} {status}"
                continue
            (content,) = answer["content"].values()
            assert "schema" in content, f"{where} {status}"
        callers = operation["x-shoal-callers"]
        assert callers, where
        if (method, path) in PUBLIC:
            assert callers == ["public"], where
            assert operation["security"] == [{}], where
            continue
        assert "public" not in callers, where
        requirement = operation["security"][0]
        schemes = document["components"]["securitySchemes"]
        assert {schemes[name]["name"] for name in requirement} == HEADERS, where
        # without a secret the headers are optional (an empty requirement), with one they are not
        assert ({} in operation["security"]) is not signed, where
        if signed:
            assert "401" in operation["responses"], where
    bodies = {f"{m} {p}" for m, p, op in operations if "requestBody" in op}
    assert {
        "POST /v1/records/games",
        "POST /v1/records/rollouts",
        "POST /v1/sync/{category}/pull",
        "POST /v1/sync/run",
        "POST /v1/election/vote",
        "POST /v1/election/heartbeat",
        "POST /v1/actors/{name}/claim",
        "POST /v1/actors/{name}/ready",
        "POST /v1/actors/{name}/dead",
        "POST /v1/jobs/gang/pick",
        "POST /v1/jobs/{job_id}/kill",
        "POST /v1/locks/{name}/acquire",
        "POST /v1/locks/{name}/renew",
        "POST /v1/locks/{name}/release",
        "POST /v1/lockstore/prepare",
        "POST /v1/lockstore/accept",
        "POST /v1/runs",
        "POST /v1/runs/{run_id}/cancel",
        "POST /v1/weights/update",
        "POST /v1/weights/applied",
    } <= bodies
    # every route that takes a body documents it: no POST is left to "any body"
    assert {f"{m} {p}" for m, p, _ in operations if m == "POST"} <= bodies
    # the handlers' own models, not schemas written a second time
    for path, model in (
        ("/v1/locks/{name}/acquire", "AcquireBody"),
        ("/v1/runs", "RunBody"),
        ("/v1/weights/applied", "AppliedBody"),
        ("/v1/actors/{name}/ready", "ReadyBody"),
    ):
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{model}"}, path
    poll = document["paths"]["/v1/weights/next"]["get"]
    assert "content" not in poll["responses"]["204"]
    (timeout,) = [p for p in poll["parameters"] if p["name"] == "timeout_s"]
    assert timeout["schema"]["maximum"] == 60
    pull = document["paths"]["/v1/sync/{category}/pull"]["post"]["requestBody"]
    pull_schema = pull["content"]["application/json"]["schema"]
    assert pull_schema == {"$ref": "#/components/schemas/PullBody"}  # the handler's model
    games = document["paths"]["/v1/records/games"]["post"]["requestBody"]
    record = games["content"]["application/json"]["schema"]["items"]
    assert record["additionalProperties"] is False
    assert set(record["required"]) == {
        "game_id",
        "created_at",
        "board_type",
        "num_players",
        "winner",
        "moves",
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@contextmanager
def _daemon(
    tmp_path: Path, *extra: str, umask: int = -1
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`shoal serve` on a free loopback port (started with `umask` when not -1), stopped (and
    its log shown) at the end."""
    port = _free_port()
    log = tmp_path / "daemon.log"
    # The fuzzer starts jobs with random argv: only a harmless program may run (others are 403).
    config = tmp_path / "fuzzed.yaml"
    config.write_text("jobs: {allowed_programs: [/bin/true]}\n")
    args = ["serve", "--node-id", "fuzzed", "--data-dir", str(tmp_path / "data")]
    args += ["--config", str(config)]
    args += ["--port", str(port), "--no-mdns", "--bind", "127.0.0.1", *extra]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "node", *args],
            cwd=ROOT,
            stdout=out,
            stderr=out,
            text=True,
            umask=umask,
        )
    try:
        started = time.monotonic()
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if _health(port) in (200, 503):
                    break
            except OSError:
                pass
            assert time.monotonic() - started < START_LIVENESS_S, log.read_text()
            time.sleep(0.2)
        yield process, port
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _schemathesis(port: int, tmp_path: Path, examples: int, *extra: str) -> tuple[int, str]:
    """Run the schemathesis CLI against the daemon; (exit code, output)."""
    command = [
        str(SCHEMATHESIS),
        "--config-file",
        str(CONFIG),
        "run",
        f"http://127.0.0.1:{port}/v1/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(examples),
        "--workers",
        "1",
        "--seed",
        "19",
        "--generation-database",
        "none",
        "--no-color",
        "--report-dir",
        str(tmp_path / "report"),
        *extra,
    ]
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=FUZZ_LIVENESS_S
    )
    return done.returncode, done.stdout + done.stderr


def _cases(output: str) -> tuple[int, int]:
    """(generated, passed) from schemathesis's summary line."""
    match = re.search(r"(\d+) generated, (\d+) passed", output)
    assert match is not None, output[-3000:]
    return int(match.group(1)), int(match.group(2))


@pytest.mark.slow
@pytest.mark.timeout(FUZZ_LIVENESS_S + 60)
def test_schemathesis_finds_nothing_against_a_live_daemon(tmp_path: Path) -> None:
    with _daemon(tmp_path, "--insecure") as (process, port):
        code, output = _schemathesis(port, tmp_path, EXAMPLES_PER_OPERATION)
        alive = process.poll() is None and _health(port) in (200, 503)
    generated, passed = _cases(output)
    print(f"schemathesis: {generated} cases generated, {passed} passed")
    assert code == 0, output[-6000:]
    assert generated == passed
    assert generated >= 1000, output[-3000:]
    assert alive, "the daemon died under the fuzz"


@pytest.mark.slow
@pytest.mark.timeout(FUZZ_LIVENESS_S + 60)
def test_with_a_secret_every_unsigned_fuzz_request_is_refused_401(tmp_path: Path) -> None:
    """Every request schemathesis sends (it cannot sign) to any route but /v1/health and the
    document is answered 401; read from its HAR report, so none goes uncounted."""
    har = tmp_path / "run.har"
    with _daemon(tmp_path, "--secret-file", str(_secret(tmp_path))) as (process, port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/openapi.json") as answer:
            (tmp_path / "doc.json").write_bytes(answer.read())
        code, output = _schemathesis(
            port,
            tmp_path,
            SIGNED_EXAMPLES_PER_OPERATION,
            "--report",
            "har",
            "--report-har-path",
            str(har),
        )
        alive = process.poll() is None and _health(port) in (200, 503)
    assert code == 0, output[-6000:]
    assert alive
    document = json.loads((tmp_path / "doc.json").read_text())
    routes = [
        (re.compile("^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(path)) + "$"), item)
        for path, item in document["paths"].items()
    ]
    entries = json.loads(har.read_text())["log"]["entries"]
    counted = {"refused": 0, "exempt": 0, "no such method": 0}
    for entry in entries:
        method = entry["request"]["method"]
        path = re.sub(r"^https?://[^/]+", "", entry["request"]["url"]).split("?")[0]
        status = entry["response"]["status"]
        documented = any(pattern.match(path) and method.lower() in item for pattern, item in routes)
        if (method, re.sub(r"^/ui/assets/[^/]+$", "/ui/assets/{name}", path)) in UNSIGNED_OK:
            counted["exempt"] += 1
        elif documented:
            assert status == 401, f"{method} {path} answered {status} without a signature"
            counted["refused"] += 1
        else:  # a method the route does not take: the router's answer, never a success
            assert status in (404, 405), f"{method} {path} answered {status}"
            counted["no such method"] += 1
    print(f"unsigned requests: {counted}")
    assert counted["refused"] >= 100


async def test_query_integers_beyond_64_bits_are_refused_not_500(tmp_path: Path) -> None:
    """Found by the fuzz: an integer filter or key SQLite cannot hold was a 500."""
    async with NodeDaemon(test_settings(tmp_path, "ints")) as daemon, ClientSession() as session:
        base = f"http://127.0.0.1:{daemon.port}/v1/records/games/since"
        for query in ("winner=9223372036854775808", "num_players=-9223372036854775809"):
            async with session.get(f"{base}?{query}") as response:
                body = await response.json()
                assert response.status == 400, body
                assert body["param"] == query.split("=")[0]
                assert "64-bit" in body["reason"]
