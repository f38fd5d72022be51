"""Finding 8: TLS clients without a certificate that send a request head one byte at a time
were never cut off, and there was no cap on connections. Now a request head must be complete
within HEAD_DEADLINE_S (TLS or plain), a connection that sends nothing or does not finish its
handshake within PEEK_TIMEOUT_S is closed, and one client address holds at most
MAX_CONNECTIONS_PER_CLIENT connections (and MAX_HANDSHAKES_PER_CLIENT handshakes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

import node.connections
import node.identity.listener
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings
from tests.node.tls_pki import Pki, make_pki
from tests.security.attackers import slow_tls_heads

DEADLINE_S = 1.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), nodes=("a",))


async def _status(port: int, pki: Pki) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(
            f"https://127.0.0.1:{port}/v1/status", ssl=pki.client("alice"), server_hostname="a"
        ) as answer,
    ):
        return answer.status


async def _until_closed(attack_open: object, timeout_s: float) -> float:
    started = time.monotonic()
    while attack_open() and time.monotonic() - started < timeout_s:  # type: ignore[operator]
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_slow_tls_clients_are_cut_off_at_the_head_deadline(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.connections, "HEAD_DEADLINE_S", DEADLINE_S)
    settings = test_settings(tmp_path, "a", tls=pki.node_tls("a"))
    async with NodeDaemon(settings) as daemon:
        port = daemon.port
        async with slow_tls_heads(port, 3, pki.client(None), server_hostname="a") as attack:
            assert await _status(port, pki) == 200  # served beside them
            took = await _until_closed(attack.open_count, 20 * DEADLINE_S)
            assert attack.open_count() == 0, f"still open after {took:.1f} s"
        # a connection that sends nothing is closed too
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=pki.client(None), server_hostname="a"
        )
        assert await asyncio.wait_for(reader.read(), 20 * DEADLINE_S) == b""
        writer.close()
        assert await _status(port, pki) == 200


async def test_slow_tls_clients_are_capped_per_client(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.connections, "MAX_CONNECTIONS_PER_CLIENT", 4)
    monkeypatch.setattr(node.identity.listener, "MAX_HANDSHAKES_PER_CLIENT", 4)
    settings = test_settings(tmp_path, "a", tls=pki.node_tls("a"))
    async with NodeDaemon(settings) as daemon:
        port = daemon.port
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5.0) == b"", "a 5th pending handshake"
        writer.close()
        for _, idle_writer in idle:
            idle_writer.close()
        await asyncio.sleep(0.5)  # the node sees them end
        async with slow_tls_heads(port, 4, pki.client(None), server_hostname="a") as attack:
            await asyncio.sleep(0.2)
            assert attack.open_count() == 4
            with pytest.raises((aiohttp.ClientError, ConnectionError, TimeoutError)):
                await _status(port, pki)  # a 5th connection of 127.0.0.1
        assert await _status(port, pki) == 200


async def test_slow_tls_clients_and_slow_plain_ones_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.connections, "HEAD_DEADLINE_S", DEADLINE_S)
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    secret.chmod(0o600)
    settings = test_settings(tmp_path, "n1", secret_file=secret)
    async with NodeDaemon(settings) as daemon, slow_tls_heads(daemon.port, 3, None) as attack:
        took = await _until_closed(attack.open_count, 20 * DEADLINE_S)
        assert attack.open_count() == 0, f"still open after {took:.1f} s"
