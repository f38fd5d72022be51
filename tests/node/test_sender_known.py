"""A signed request's sender must be known before its body is read: a node of the receiver's
inventory, voters or membership view, or a client id (`cli-...`); any other id is 401."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiohttp import ClientSession

from config import AuthError, signed_headers, signing_middleware
from node.daemon import NodeDaemon
from node.security import AuthPolicy, check_headers
from tests.node.daemons import test_settings

SECRET = b"sender-known-test-secret-0123456789"
BODY_BYTES = 8 * 1024 * 1024
ANSWER_LIVENESS_S = 30.0


def _policy() -> AuthPolicy:
    return AuthPolicy(secret=SECRET, known_node=lambda sender: sender in {"a", "b"})


def test_an_unknown_node_id_is_refused_by_the_headers_alone() -> None:
    policy = _policy()
    for sender in ("a", "b", "cli-laptop", "monitor-desk", "api-host"):
        headers = signed_headers(SECRET, sender, "GET", "/v1/status")
        assert check_headers(policy, headers, time.time()) == sender
    headers = signed_headers(SECRET, "stranger", "GET", "/v1/status")
    with pytest.raises(AuthError, match=r"unknown sender 'stranger'.*signs as cli-NAME"):
        check_headers(policy, headers, time.time())


def test_without_a_view_every_sender_is_taken() -> None:
    policy = AuthPolicy(secret=SECRET)
    headers = signed_headers(SECRET, "stranger", "GET", "/v1/status")
    assert check_headers(policy, headers, time.time()) == "stranger"


async def _status(port: int, sender: str) -> tuple[int, dict[str, object]]:
    signer = signing_middleware(SECRET, sender)
    url = f"http://127.0.0.1:{port}/v1/status"
    async with ClientSession(middlewares=(signer,)) as session, session.get(url) as response:
        return response.status, await response.json()


async def _refused_before_the_body(port: int, sender: str) -> bytes:
    """Send the headers of a large signed POST and no body: the answer must come anyway."""
    headers = signed_headers(SECRET, sender, "POST", "/v1/records/games", b"[]")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [
            "POST /v1/records/games HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Content-Type: application/json",
            f"Content-Length: {BODY_BYTES}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), ANSWER_LIVENESS_S)
    finally:
        writer.close()


async def test_a_daemon_refuses_unknown_senders_and_takes_nodes_and_clients(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    settings = test_settings(tmp_path, "a", secret_file=secret, voters=["a", "b"])
    async with NodeDaemon(settings) as daemon:
        for sender in ("a", "b", "cli-laptop"):  # itself, a voter, a client
            status, body = await _status(daemon.port, sender)
            assert status == 200, (sender, body)
        status, body = await _status(daemon.port, "stranger")
        assert status == 401
        assert body["error"] == "unauthorized"
        assert "unknown sender 'stranger'" in str(body["reason"])
        answer = await _refused_before_the_body(daemon.port, "stranger")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"unknown sender" in answer


JOIN_LIVENESS_S = 30.0


async def test_a_node_known_only_through_the_membership_view_is_taken(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    async with NodeDaemon(test_settings(tmp_path, "a", secret_file=secret)) as first:
        status, _ = await _status(first.port, "c")
        assert status == 401  # not yet a member
        seed = f"127.0.0.1:{first.port}"
        settings = test_settings(tmp_path, "c", secret_file=secret, seeds=(seed,))
        async with NodeDaemon(settings):
            deadline = time.monotonic() + JOIN_LIVENESS_S
            while (status := (await _status(first.port, "c"))[0]) != 200:
                assert time.monotonic() < deadline, f"c never became a known sender ({status})"
                await asyncio.sleep(0.1)
