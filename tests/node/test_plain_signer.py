"""A signer written from docs/signing.md alone, with plain hmac."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.client
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from node.daemon import NodeDaemon
from tests.node.daemons import test_settings

KEY_TEXT = "  plain-signer-test-secret-0123456789  \n"


def plain_request(
    port: int,
    method: str,
    target: str,
    body: bytes = b"",
    key_text: str = KEY_TEXT,
    node: str = "signed",
) -> tuple[int, Any]:
    """One request signed for node `node` exactly as docs/signing.md says, with no code of
    shoal's."""
    key = key_text.strip().encode()
    timestamp = str(int(time.time()))
    nonce = secrets.token_hex(16)
    digest = hashlib.sha256(body).hexdigest()
    lines = ["shoal-request-v2", method.upper(), target, timestamp, nonce, digest]
    lines += ["cli-plain", node, "", "", ""]  # sender, target node, cluster, fence, forwarded
    message = "\n".join(lines)
    headers = {
        "X-Shoal-Node": "cli-plain",
        "X-Shoal-Target": node,
        "X-Shoal-Timestamp": timestamp,
        "X-Shoal-Nonce": nonce,
        "X-Shoal-Signature": hmac.new(key, message.encode(), hashlib.sha256).hexdigest(),
        "Content-Type": "application/json",
    }
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, target, body=body or None, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


async def test_a_plain_hmac_signer_from_the_readme_is_accepted(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(KEY_TEXT)
    os.chmod(secret_file, 0o600)
    settings = test_settings(tmp_path, "signed", secret_file=secret_file)
    async with NodeDaemon(settings) as daemon:
        port = daemon.port
        status, document = await asyncio.to_thread(
            plain_request, port, "GET", "/v1/records/games/since?ts=0&limit=5"
        )
        assert status == 200, document
        assert document["records"] == []
        record = {
            "game_id": "g1", "created_at": 1.0, "board_type": "hex8",
            "num_players": 2, "winner": 1, "moves": ["a1", "b2"],
        }  # fmt: skip
        body = json.dumps([record]).encode()
        status, document = await asyncio.to_thread(
            plain_request, port, "POST", "/v1/records/games", body
        )
        assert status == 200, document
        assert document["accepted"] == 1
        status, document = await asyncio.to_thread(
            plain_request, port, "GET", "/v1/status", b"", "wrong-key-wrong-key-wrong-key"
        )
        assert status == 401, document
        status, document = await asyncio.to_thread(
            plain_request, port, "GET", "/v1/status", b"", KEY_TEXT, "another"
        )
        assert (status, document["error"]) == (401, "wrong_target"), document
