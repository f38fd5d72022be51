"""Item 4's second half: a call a node forwards for an operator (to the coordinator, or to the
node asked to leave) carries the operator's proof, never a bare X-Shoal-Forwarded header. The
node that acts checks the proof (an operator certificate's signature over the request, or the
cluster signature of the original) and audits as that operator, naming the forwarding node; a
proof that does not sign this request is refused (403); a bare header makes the call the
forwarding node's own."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from config.tls.proof import operator_prover
from node.cli.common import peer_client
from node.daemon import NodeDaemon
from node.forwarding import PROOF_HEADER
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.jobs.helpers import write_secret
from tests.node.tls_pki import Pki, make_pki

NODES = ("a", "b")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), nodes=NODES)


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


async def _as_node(
    pki: Pki, name: str, port: int, server: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{port}{path}",
            data=body,
            headers={"Content-Type": "application/json", **headers},
            ssl=pki.client(name),
            server_hostname=server,
        ) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


async def _audit(daemon: NodeDaemon, pki: Pki) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"https://127.0.0.1:{daemon.port}/v1/audit?kind=drain",
            ssl=pki.client("alice"),
            server_hostname=daemon.settings.node_id or "",
        ) as answer,
    ):
        assert answer.status == 200, await answer.text()
        entries: list[dict[str, Any]] = (await answer.json())["entries"]
        return entries


async def _two_nodes(
    stack: AsyncExitStack, tmp_path: Path, **flags: Any
) -> tuple[dict[str, NodeDaemon], str, str]:
    """Two voters, a and b, with `flags`; (daemons, the coordinator, the other) once elected."""
    daemons: dict[str, NodeDaemon] = {}
    for name in NODES:
        seeds = [f"127.0.0.1:{daemons['a'].port}"] if daemons else []
        extra = {**flags, "tls": flags["tls"](name)} if "tls" in flags else flags
        settings = test_settings(
            tmp_path, name, voters=NODES, seeds=seeds, **extra, **FAST_ELECTION
        )
        daemons[name] = await stack.enter_async_context(NodeDaemon(settings))

    def coordinator() -> str | None:
        seen = set()
        for daemon in daemons.values():
            assert daemon.runtime is not None
            daemon.runtime.refresh()
            seen.add(daemon.runtime.coordinator)
        return seen.pop() if len(seen) == 1 else None

    await _until(lambda: coordinator() is not None, 60.0, "one coordinator")
    leader = coordinator()
    assert leader is not None
    return daemons, leader, next(name for name in NODES if name != leader)


@pytest.mark.timeout(180)
async def test_forwarded_operator_proof_is_checked_and_audited_where_it_acts(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncExitStack() as stack:
        daemons, leader, other = await _two_nodes(stack, tmp_path, tls=pki.node_tls)
        monkeypatch.setenv("SHOAL_TLS_CERT", str(pki.cert("alice")))
        monkeypatch.setenv("SHOAL_TLS_KEY", str(pki.key("alice")))
        monkeypatch.setenv("SHOAL_TLS_CA", str(pki.ca_cert))
        settings = test_settings(tmp_path, "cli", secret_file=None)
        # the operator asks a node that does not coordinate: it forwards, with the proof (asked
        # again of the other one should the coordinator change under load meanwhile)
        async with peer_client(settings, timeout_s=20.0) as peers:
            deadline = time.monotonic() + 90.0
            while True:
                path = f"/v1/nodes/{other}/drain"
                answer = await peers.request(
                    "POST", f"https://127.0.0.1:{daemons[other].port}", path,
                    json={"kill_after_s": 600}, check=False,
                )  # fmt: skip
                acted = answer.json().get("coordinator") if answer.status == 200 else None
                if (acted is not None and acted != other) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
                leader, other = (other, leader) if acted == other else (leader, other)
        assert answer.status == 200, answer.body
        assert acted is not None
        assert acted != other
        leader, acting, asked = acted, daemons[acted], daemons[other]
        at_coordinator = [e for e in await _audit(acting, pki) if e["action"] == "drain"]
        assert at_coordinator, "the coordinator acted and did not audit it"
        assert at_coordinator[-1]["sender"] == "alice"
        assert at_coordinator[-1]["detail"]["forwarded_by"] == other
        at_asked = [e for e in await _audit(asked, pki) if e["action"] == "drain"]
        assert at_asked[-1]["sender"] == "alice"

        # a proof that signs another body is refused where it would act
        prove = operator_prover(pki.cert("alice"), pki.key("alice"))
        proof = prove("POST", path, json.dumps({"kill_after_s": 1}).encode(), other)
        forged = base64.b64encode(json.dumps(proof).encode()).decode()
        status, body = await _as_node(
            pki, other, acting.port, leader, path, json.dumps({"kill_after_s": 0}).encode(),
            {"X-Shoal-Forwarded": other, PROOF_HEADER: forged},
        )  # fmt: skip
        assert status == 403, body
        assert body["error"] == "forwarded_refused"
        # ... and a genuine one is served once, then refused (a replay)
        raw = json.dumps({"kill_after_s": 5}).encode()
        for _ in range(50):
            genuine = prove("POST", path, raw, other)
            proven = base64.b64encode(json.dumps(genuine).encode()).decode()
            headers = {"X-Shoal-Forwarded": other, PROOF_HEADER: proven}
            status, body = await _as_node(pki, other, acting.port, leader, path, raw, headers)
            if status != 503:  # (a coordinator rereading its table)
                break
            await asyncio.sleep(0.2)
        assert status == 200, body
        status, body = await _as_node(pki, other, acting.port, leader, path, raw, headers)
        assert status == 403, body
        assert "replay" in body["reason"]

        # a bare header: the call is the forwarding node's own, never the operator's
        undrain = f"/v1/nodes/{other}/undrain"
        status, body = await _as_node(
            pki, other, acting.port, leader, undrain, b"{}", {"X-Shoal-Forwarded": other}
        )
        if status == 200:  # (where a node may undrain at all)
            entries = [e for e in await _audit(acting, pki) if e["action"] == "undrain"]
            assert entries[-1]["sender"] == other
            assert "forwarded_by" not in entries[-1]["detail"]


@pytest.mark.timeout(180)
async def test_forwarded_operator_proof_of_a_signed_original(tmp_path: Path) -> None:
    secret = write_secret(tmp_path)
    async with AsyncExitStack() as stack:
        daemons, leader, other = await _two_nodes(stack, tmp_path, secret_file=secret)
        settings = test_settings(tmp_path, "cli", secret_file=secret)
        async with peer_client(settings, timeout_s=20.0) as peers:
            deadline = time.monotonic() + 60.0
            while True:
                answer = await peers.request(
                    "POST", f"http://127.0.0.1:{daemons[other].port}",
                    f"/v1/nodes/{other}/drain", json={"kill_after_s": 600}, check=False,
                )  # fmt: skip
                if answer.status != 503 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert answer.status == 200, answer.body
            audit = await peers.request(
                "GET", f"http://127.0.0.1:{daemons[str(leader)].port}", "/v1/audit?kind=drain"
            )
        entries = [e for e in audit.json()["entries"] if e["action"] == "drain"]
        assert entries, "the coordinator acted and did not audit it"
        assert entries[-1]["sender"].startswith("cli-")
        assert entries[-1]["detail"]["forwarded_by"] == other
