"""Deny by default, walked: a daemon with TLS identities serves its OpenAPI document, and every
operation in it is called with a node certificate, an operator certificate, a reader
certificate and no certificate. Each answer must match the operation's declared callers
(`x-shoal-callers`): refused (401/403) when the caller's class is not declared, anything else
when it is (a 400/404/409 for a made-up body is fine). A node certificate gets 403 on every
operator route."""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openapi_spec_validator import validate

from config import signing_middleware
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings
from tests.node.tls_pki import Pki, make_pki

REFUSED = {401, 403}
SECRET = b"access-walk-secret-0123456789abcdef"
CALLERS = {"b": "peer", "alice": "operator", "rita": "reader", None: "public"}
"""Each identity of make_pki and the caller class it is (None: no certificate)."""
CONCRETE = {"node": "not-a-member"}
"""Path values that keep a walked call harmless (a leave of the walked node would stop it)."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _concrete(path: str) -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: CONCRETE.get(m.group(1), "x"), path)


async def _call(port: int, context: ssl.SSLContext, method: str, path: str) -> tuple[int, str, str]:
    """(status, error code or "", Location) of one call with an empty JSON object as body."""
    body = {} if method in ("POST", "PUT", "PATCH") else None
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            f"https://127.0.0.1:{port}{path}",
            json=body,
            ssl=context,
            server_hostname="a",
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=60),
        ) as response,
    ):
        code = ""
        if response.content_type == "application/json":
            answer = await response.json()
            code = answer.get("error", "") if isinstance(answer, dict) else ""
        return response.status, code, response.headers.get("Location", "")


def _admitted(callers: list[str], caller: str) -> bool:
    """Whether a caller of class `caller` is declared for the operation. A node on a `fenced`
    route is admitted only with the current plan's fence, which the walk does not send."""
    return "public" in callers or caller in callers


async def test_every_operation_answers_each_caller_as_declared(tmp_path: Path, pki: Pki) -> None:
    async with NodeDaemon(test_settings(tmp_path, "a", tls=pki.node_tls("a"))) as daemon:
        status, _, _ = await _call(daemon.port, pki.client(None), "GET", "/v1/openapi.json")
        assert status == 200
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"https://127.0.0.1:{daemon.port}/v1/openapi.json",
                ssl=pki.client(None),
                server_hostname="a",
            ) as response,
        ):
            document: dict[str, Any] = await response.json()
        validate(document)  # the certificate roles are a valid mutualTLS requirement
        roles = {"peer": "node", "fenced": "node", "operator": "operator", "reader": "reader"}
        for path, item in document["paths"].items():
            for method, operation in item.items():
                declared = {roles[c] for c in operation["x-shoal-callers"] if c in roles}
                listed = [r for r in operation["security"] if "clientCertificate" in r]
                certificate = set(listed[0]["clientCertificate"]) if listed else set()
                assert certificate == declared, f"{method.upper()} {path}"
        wrong: list[str] = []
        walked = 0
        operator_routes = 0
        for path, item in sorted(document["paths"].items()):
            for method, operation in item.items():
                callers = operation["x-shoal-callers"]
                assert callers, f"{method.upper()} {path} declares no callers"
                for name, caller in CALLERS.items():
                    status, code, location = await _call(
                        daemon.port, pki.client(name), method.upper(), _concrete(path)
                    )
                    walked += 1
                    refused = status in REFUSED or location.endswith("/ui/login")
                    admitted = _admitted(callers, caller)
                    if admitted == refused:
                        wrong.append(
                            f"{method.upper()} {path} as {caller}: {status} {code} "
                            f"(declared {callers})"
                        )
                    if name == "b" and callers == ["operator"]:
                        operator_routes += 1
                        if status != 403:
                            wrong.append(f"{method.upper()} {path}: a node got {status}, not 403")
        assert not wrong, "\n".join(wrong)
        assert walked >= 4 * 70
        assert operator_routes >= 10


SIGNERS = {"hm": "peer", "cli-walk": "operator", "monitor-walk": "reader", None: "public"}
"""Under auth hmac: the node's own id (a known node), a `shoal` command, cluster_monitor,
nobody."""
BROWSER_PAGES = {("GET", "/ui/")}
"""The dashboard's page takes its session or a certificate, never a signature (a redirect)."""


async def _signed(port: int, sender: str | None, method: str, path: str) -> tuple[int, str]:
    """(status, error code or "") of one call signed by `sender` (None: unsigned)."""
    middlewares = () if sender is None else (signing_middleware(SECRET, sender),)
    body = {} if method in ("POST", "PUT", "PATCH") else None
    async with (
        aiohttp.ClientSession(middlewares=middlewares) as session,
        session.request(
            method,
            f"http://127.0.0.1:{port}{path}",
            json=body,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=60),
        ) as response,
    ):
        answer = await response.json() if response.content_type == "application/json" else {}
        return response.status, answer.get("error", "") if isinstance(answer, dict) else ""


async def test_under_hmac_each_signer_is_the_class_its_id_names(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    async with NodeDaemon(test_settings(tmp_path, "hm", secret_file=secret)) as daemon:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{daemon.port}/v1/openapi.json") as response,
        ):
            document: dict[str, Any] = await response.json()
        wrong: list[str] = []
        for path, item in sorted(document["paths"].items()):
            for method, operation in item.items():
                if (method.upper(), path) in BROWSER_PAGES:
                    continue
                callers = operation["x-shoal-callers"]
                for sender, caller in SIGNERS.items():
                    status, code = await _signed(
                        daemon.port, sender, method.upper(), _concrete(path)
                    )
                    if _admitted(callers, caller) == (status in REFUSED):
                        wrong.append(f"{method.upper()} {path} signed by {sender}: {status} {code}")
        assert not wrong, "\n".join(wrong)
