"""The rolling migration hmac -> hmac+tls -> tls (docs/security.md) on five netns hosts under a
steady record ingest: one node at a time is restarted with the next auth mode while a client on
a sixth host samples every node's /v1/status and ingests one game at a time to the nodes in
turn. Checked: no term ever had two coordinators, every node rejoined and agreed after each
restart, and every game a node acknowledged is on every node at the end. Once a node runs
`tls` it refuses plain HTTP from other hosts, so its peers reach it only over TLS (their
per-peer choice, node.identity.peer_tls)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from config import signing_middleware
from tests.cluster import ClusterProcess, Host, NetnsClusterFactory
from tests.cluster.sshd import run_in_namespace
from tests.cluster.waiting import wait_until
from tests.node.tls_pki import Pki, make_pki

HOSTS = 5
SECRET = b"tls-migration-test-secret-0123456789abcdef"
RATE_HZ = 5.0
CLIENT_S = 900.0
SETTLE_S = 120.0
SYNC_S = 120.0
KEYS_PER_GET = 200


@dataclass
class _Shared:
    """What the test thread and the client (in the operator's namespace) share."""

    modes: dict[str, str]
    stop: threading.Event = field(default_factory=threading.Event)
    latest: dict[str, tuple[float, Any]] = field(default_factory=dict)
    """Per node: (when, [term, coordinator, alive members] or None) of the newest sample."""


def _start(
    host: Host, pki: Pki, secret: Path, mode: str, seed: str, names: list[str]
) -> ClusterProcess:
    config: dict[str, Any] = {
        "node_id": host.name,
        "data_dir": str(host.data_dir / "data"),
        "bind": host.address,
        "port": host.port,
        "mdns": False,
        "secret_file": str(secret),
        "seeds": [seed],
        "voters": names,
        "sync_interval_s": 2,
    }
    if mode != "hmac":
        config["tls"] = pki.node_tls(host.name)
        config["auth"] = mode
    path = host.data_dir / f"shoal-{mode}.yaml"
    path.write_text(yaml.safe_dump(config))
    return host.spawn(
        [sys.executable, "-m", "node.cli", "serve", "--config", str(path)], name=f"shoal-{mode}"
    )


def _game(key: str, index: int) -> dict[str, Any]:
    return {
        "game_id": key,
        "created_at": 1000.0 + index,
        "board_type": "hex8",
        "num_players": 2,
        "winner": index % 2,
        "moves": ["a1", "b2"],
    }


async def _client(state: _Shared, hosts: list[Host], pki: Pki) -> dict[str, Any]:
    context = pki.client("alice")
    context.check_hostname = False  # operator sessions: the node certs name 127.0.0.1 only
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(
            middlewares=(signing_middleware(SECRET, "cli-migrate"),), timeout=timeout
        ) as plain,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context), timeout=timeout) as tls,
    ):

        def url(host: Host) -> tuple[aiohttp.ClientSession, str]:
            if state.modes[host.name] == "hmac":
                return plain, f"http://{host.endpoint}"
            return tls, f"https://{host.endpoint}"

        async def call(host: Host, method: str, path: str, **kw: Any) -> tuple[int, Any]:
            session, base = url(host)
            async with session.request(method, base + path, **kw) as answer:
                return answer.status, await answer.json(content_type=None)

        async def status(host: Host) -> list[Any] | None:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                code, body = await call(host, "GET", "/v1/status")
                if code == 200:
                    return [body["term"], body["coordinator"], body["members"]["alive"]]
            return None

        samples: list[dict[str, Any]] = []
        acked: list[str] = []
        index = 0
        while not state.stop.is_set():
            seen = await asyncio.gather(*(status(h) for h in hosts))
            now = time.monotonic()
            samples.append({h.name: s for h, s in zip(hosts, seen, strict=True)})
            for host, answer in zip(hosts, seen, strict=True):
                state.latest[host.name] = (now, answer)
            host = hosts[index % len(hosts)]
            key = f"migrate-{index}"
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                code, _ = await call(host, "POST", "/v1/records/games", json=[_game(key, index)])
                if code == 200:
                    acked.append(key)
            index += 1
            await asyncio.sleep(1 / RATE_HZ)

        async def missing() -> dict[str, list[str]]:
            lacking: dict[str, list[str]] = {}
            for host in hosts:
                found: set[str] = set()
                for start in range(0, len(acked), KEYS_PER_GET):
                    params = [("key", k) for k in acked[start : start + KEYS_PER_GET]]
                    code, body = await call(host, "GET", "/v1/records/games/get", params=params)
                    assert code == 200, body
                    found.update(record["game_id"] for record in body["records"])
                lacking[host.name] = sorted(set(acked) - found)
            return lacking

        deadline = time.monotonic() + SYNC_S
        while True:
            lacking = await missing()
            if not any(lacking.values()) or time.monotonic() > deadline:
                break
            for host in hosts:
                if lacking[host.name]:
                    body = {"categories": ["games"]}
                    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                        await call(host, "POST", "/v1/sync/run", json=body)
            await asyncio.sleep(0.5)
        return {"samples": samples, "acked": acked, "missing": lacking}


def _settled(state: _Shared, names: list[str], since: float) -> bool:
    """Every node answered after `since`, all name one coordinator and see every node alive."""
    answers = [state.latest.get(name) for name in names]
    if any(a is None or a[0] < since or a[1] is None for a in answers):
        return False
    named = {(a[1][0], a[1][1]) for a in answers if a is not None and a[1] is not None}
    alive = {a[1][2] for a in answers if a is not None and a[1] is not None}
    return len(named) == 1 and next(iter(named))[1] is not None and alive == {len(names)}


@pytest.mark.netns
@pytest.mark.timeout(900)
def test_hmac_to_tls_rolling_migration_under_ingest(
    netns_cluster: NetnsClusterFactory, tmp_path: Path
) -> None:
    cluster = netns_cluster(HOSTS + 1)
    operator, *targets = cluster.hosts
    names = [h.name for h in targets]
    pki = make_pki(tmp_path / "pki", nodes=tuple(names))
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    seed = targets[0].endpoint
    state = _Shared(dict.fromkeys(names, "hmac"))
    procs: dict[str, ClusterProcess] = {
        h.name: _start(h, pki, secret, "hmac", seed, names) for h in targets
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        client = pool.submit(
            run_in_namespace, operator.ns, lambda: _client(state, targets, pki), CLIENT_S
        )
        try:
            started = time.monotonic()
            wait_until(
                lambda: _settled(state, names, started),
                timeout_s=SETTLE_S,
                interval_s=0.2,
                message="the hmac cluster to agree on a coordinator",
            )
            for mode in ("hmac+tls", "tls"):
                for host in targets:
                    procs[host.name].terminate()
                    state.modes[host.name] = mode
                    procs[host.name] = _start(host, pki, secret, mode, seed, names)
                    restarted = time.monotonic()
                    wait_until(
                        functools.partial(_settled, state, names, restarted),
                        timeout_s=SETTLE_S,
                        interval_s=0.2,
                        message=f"{host.name} to rejoin with auth {mode} and all to agree",
                    )
        finally:
            state.stop.set()
        result = client.result(timeout=CLIENT_S)

    terms: dict[int, set[str]] = {}
    for sample in result["samples"]:
        for answer in sample.values():
            if answer is not None and answer[0] is not None and answer[1] is not None:
                terms.setdefault(int(answer[0]), set()).add(str(answer[1]))
    assert terms, "no sample named a coordinator"
    assert all(len(named) == 1 for named in terms.values()), terms
    assert len(result["acked"]) >= RATE_HZ * 10, len(result["acked"])
    assert result["missing"] == {name: [] for name in names}, result["missing"]
    # every node ended on auth tls: plain HTTP from the operator's host is refused
    assert set(state.modes.values()) == {"tls"}
