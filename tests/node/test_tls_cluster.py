"""Node-to-node calls over TLS: three daemons with `auth: tls` and no cluster secret (so nothing
is served in plain HTTP, not even on loopback) form one membership view, elect one coordinator,
sync a file and a record and run a gang across them, every peer call through net with the
node's certificate and the peer's node id as server_hostname (node.identity.peer_tls). A
`hmac+tls` node calls a `tls` peer over https and a `hmac` peer in plain HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest

from config.settings import AuthMode
from net import Identity, PeerClient
from node.daemon import NodeDaemon
from node.identity import AUTH_META, peer_tls
from node.runtime import NodeRuntime
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.tls_pki import Pki, make_pki

NAMES = ("n1", "n2", "n3")
SECRET = b"tls-cluster-test-secret-0123456789abcdef"
REPORT = (
    "import os\nprint(os.environ['SHOAL_NODE_RANK'], os.environ['SHOAL_NODES_NUM'], flush=True)\n"
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), nodes=(*NAMES, "m1", "m2"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await check()
        if seen:
            return seen
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _operator(pki: Pki) -> AsyncIterator[aiohttp.ClientSession]:
    """A session presenting the operator certificate `alice`."""
    connector = aiohttp.TCPConnector(ssl=pki.client("alice"))
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


async def _json(
    session: aiohttp.ClientSession, method: str, port: int, path: str, body: Any = None
) -> tuple[int, Any]:
    async with session.request(method, f"https://127.0.0.1:{port}{path}", json=body) as answer:
        return answer.status, await answer.json()


@pytest.mark.timeout(240)
async def test_three_tls_nodes_elect_sync_and_run_a_gang(tmp_path: Path, pki: Pki) -> None:
    ports = {name: _free_port() for name in NAMES}
    common: dict[str, Any] = {
        **FAST_ELECTION,
        "voters": NAMES,
        "role": "training",
        "backend": "gloo",
        "sync_interval_s": 0,
        "seeds": (f"127.0.0.1:{ports['n1']}",),
    }
    async with contextlib.AsyncExitStack() as stack:
        daemons: dict[str, NodeDaemon] = {}
        for name in NAMES:
            settings = test_settings(
                tmp_path, name, port=ports[name], tls=pki.node_tls(name), **common
            )
            assert settings.auth_mode is AuthMode.TLS
            assert settings.secret_file is None
            daemons[name] = await stack.enter_async_context(NodeDaemon(settings))
        session = await stack.enter_async_context(_operator(pki))

        async def agreed() -> bool:
            seen = [(await _json(session, "GET", p, "/v1/status"))[1] for p in ports.values()]
            fences = {(s["coordinator"], s["term"], s["plan_version"]) for s in seen}
            alive = {s["members"]["alive"] for s in seen}
            return len(fences) == 1 and None not in next(iter(fences)) and alive == {3}

        await _until(agreed, 60, "one coordinator and plan over TLS, 3 alive members each")

        # a file and a record on n1, pulled by n2 over TLS
        source, dest = daemons["n1"], daemons["n2"]
        models = source.settings.category_path("models") / "tls"
        models.mkdir(parents=True)
        (models / "weights.bin").write_bytes(b"w" * 70_000)
        record = {
            "game_id": "g-tls",
            "created_at": time.time(),
            "board_type": "hex8",
            "num_players": 2,
            "winner": 1,
            "moves": ["a1"],
        }
        status, answer = await _json(session, "POST", ports["n1"], "/v1/records/games", [record])
        assert status == 200, answer
        assert dest.sync_service is not None

        async def pulled() -> dict[str, Any] | None:
            assert dest.sync_service is not None
            peers = [p for p in dest.sync_service.alive_peers() if p.node_id == "n1"]
            summary = await dest.sync_service.run_once(["models", "games"], peers)
            copied = dest.settings.category_path("models") / "tls" / "weights.bin"
            return summary if copied.exists() else None

        summary = await _until(pulled, 30, "n2 to pull n1's file over TLS")
        assert summary["records"]["games"]["failed_nodes"] == {}, summary
        copied = dest.settings.category_path("models") / "tls" / "weights.bin"
        assert copied.read_bytes() == b"w" * 70_000
        status, counted = await _json(session, "GET", ports["n2"], "/v1/records/games/status")
        assert status == 200, counted
        assert counted["count"] == 1, counted

        # a gang of three, started on a node that is not the coordinator
        _, first = await _json(session, "GET", ports["n1"], "/v1/status")
        receiver = next(name for name in NAMES if name != first["coordinator"])
        spec = {"job_id": "g-tls", "name": "report", "argv": [sys.executable, "-c", REPORT]}
        status, gang = await _json(
            session, "POST", ports[receiver], "/v1/jobs", {**spec, "nodes": 3, "role": "training"}
        )
        assert status == 201, gang
        status, done = await _json(
            session, "GET", ports[receiver], "/v1/jobs/g-tls/wait?timeout_s=60"
        )
        assert status == 200, done
        assert done["state"] == "succeeded", done
        members = done["gang"]["members"]
        assert [m["rank"] for m in members] == [0, 1, 2]
        assert sorted(m["node"] for m in members) == sorted(NAMES)


def _runtime(own: AuthMode, members: list[tuple[str, int, str | None]]) -> NodeRuntime:
    contexts = SimpleNamespace(client_context=lambda: CONTEXT)
    membership = SimpleNamespace(
        members=lambda: [
            SimpleNamespace(
                node_id=name, address="10.0.0.9", port=port, meta={AUTH_META: auth} if auth else {}
            )
            for name, port, auth in members
        ]
    )
    runtime = SimpleNamespace(
        tls=contexts,
        settings=SimpleNamespace(auth_mode=own, port=8770),
        address="10.0.0.1",
        port=8770,
        node_id="self",
        membership=membership,
    )
    return cast(NodeRuntime, runtime)


CONTEXT = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
PEERS = [("t", 1, "tls"), ("h", 2, "hmac"), ("both", 3, "hmac+tls"), ("old", 4, None)]


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        (AuthMode.TLS, {"t": "t", "h": "h", "both": "both", "old": "old", "seed": "10.0.0.7"}),
        (AuthMode.HMAC_TLS, {"t": "t", "h": None, "both": "both", "old": None, "seed": None}),
    ],
)
def test_peer_tls_follows_both_auth_modes(own: AuthMode, expected: Mapping[str, Any]) -> None:
    choose = peer_tls(_runtime(own, PEERS))
    assert choose is not None
    ports = {"t": 1, "h": 2, "both": 3, "old": 4}
    seen = {}
    for name, port in ports.items():
        choice = choose(f"10.0.0.9:{port}")
        seen[name] = None if choice is None else choice[1]
        assert choice is None or choice[0] is CONTEXT
    choice = choose("10.0.0.7:8770")  # no member there yet: a seed
    seen["seed"] = None if choice is None else choice[1]
    assert seen == expected
    assert choose("10.0.0.1:8770") == (CONTEXT, "self")


def test_no_tls_no_choice() -> None:
    runtime = _runtime(AuthMode.TLS, PEERS)
    cast(Any, runtime).tls = None
    assert peer_tls(runtime) is None


async def test_a_hmac_tls_node_calls_a_tls_peer_over_https(tmp_path: Path, pki: Pki) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    common: dict[str, Any] = {"secret_file": secret, "sync_interval_s": 0}
    tls_node = NodeDaemon(test_settings(tmp_path, "m2", tls=pki.node_tls("m2"), **common))
    async with tls_node as m2:
        seeds = (f"127.0.0.1:{m2.port}",)
        mixed = test_settings(
            tmp_path, "m1", tls=pki.node_tls("m1"), auth="hmac+tls", seeds=seeds, **common
        )
        async with NodeDaemon(mixed) as m1:
            assert m1.runtime is not None
            assert m1.sync_service is not None

            async def sees_m2() -> bool:
                assert m1.sync_service is not None
                return any(p.node_id == "m2" for p in m1.sync_service.alive_peers())

            await _until(sees_m2, 20, "m1 to see m2 alive")
            choose = peer_tls(m1.runtime)
            assert choose is not None
            choice = choose(f"127.0.0.1:{m2.port}")
            assert choice is not None
            assert choice[1] == "m2"
            async with PeerClient(Identity(SECRET, "m1"), tls=choose) as peers:
                assert peers.base_url(f"http://127.0.0.1:{m2.port}").startswith("https://")
                status = await peers.get_json(f"127.0.0.1:{m2.port}", "/v1/status")
            assert status["node_id"] == "m2"
            # the node's own peer calls: m1's record pull from m2 goes over https
            peers_of_m2 = [p for p in m1.sync_service.alive_peers() if p.node_id == "m2"]
            summary = await m1.sync_service.run_once(["games"], peers_of_m2)
            assert summary["records"]["games"]["failed_nodes"] == {}, summary
            own = m1.sync_service._peers  # the sync service's own peer client
            assert own is not None
            assert set(cast(Any, own.transport).sessions) == {f"https://127.0.0.1:{m2.port}"}
