"""Finding 5: a signature covered method, path, query, time, nonce and body, but not the node it
was sent to nor the headers the receiver acts on, and each node keeps its own nonces: a request
signed for n1 replayed byte for byte to n2 ran there. Now the signature (v2) covers the target
node (X-Shoal-Target), the sender, X-Shoal-Cluster, X-Shoal-Fence and X-Shoal-Forwarded; a node
refuses a request signed for another (401 `wrong_target`, naming itself in X-Shoal-Receiver),
and a v1 signature (the previous release's) only from its own host or a member of the previous
release."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from config import AuthError, NonceCache, verify_request
from node.daemon import NodeDaemon
from node.security import AuthPolicy, check_headers, local_or_previous
from tests.node.daemons import test_settings
from tests.node.jobs.helpers import SECRET, signed_session, write_secret

NODES = ("n1", "n2", "n3")


def _signed(method: str, path: str, body: bytes, target: str, **extra: str) -> dict[str, str]:
    """Headers of a request signed for node `target` as docs/signing.md says (plain hmac)."""
    headers = {
        "X-Shoal-Node": "cli-tester",
        "X-Shoal-Timestamp": str(int(time.time())),
        "X-Shoal-Nonce": secrets.token_hex(16),
        "X-Shoal-Target": target,
        **extra,
    }
    bound = [
        headers.get(name, "")
        for name in (
            "X-Shoal-Node",
            "X-Shoal-Target",
            "X-Shoal-Cluster",
            "X-Shoal-Fence",
            "X-Shoal-Forwarded",
        )
    ]
    lines = [
        "shoal-request-v2",
        method,
        path,
        headers["X-Shoal-Timestamp"],
        headers["X-Shoal-Nonce"],
        hashlib.sha256(body).hexdigest(),
        *bound,
    ]
    message = "\n".join(lines).encode()
    headers["X-Shoal-Signature"] = hmac.new(SECRET, message, hashlib.sha256).hexdigest()
    return {**headers, "Content-Type": "application/json"}


@asynccontextmanager
async def _nodes(tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    secret = write_secret(tmp_path)
    async with AsyncExitStack() as stack:
        urls = {}
        for name in NODES:
            daemon = await stack.enter_async_context(
                NodeDaemon(test_settings(tmp_path, name, secret_file=secret))
            )
            urls[name] = f"http://127.0.0.1:{daemon.port}"
        yield urls


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], dict[str, object]]:
    async with session.post(f"{url}/v1/jobs", data=body, headers=headers) as answer:
        return answer.status, dict(answer.headers), await answer.json()


async def test_cross_node_replay_is_refused_on_every_other_node(tmp_path: Path) -> None:
    body = json.dumps({"job_id": "j-replayed", "argv": ["true"]}).encode()
    headers = _signed("POST", "/v1/jobs", body, "n1")
    async with _nodes(tmp_path) as urls, aiohttp.ClientSession() as session:
        status, _, answer = await _post(session, urls["n1"], body, headers)
        assert status == 201, answer
        for other in ("n2", "n3"):
            status, sent, answer = await _post(session, urls[other], body, headers)
            assert status == 401, answer
            assert answer["error"] == "wrong_target"
            assert "signed for node 'n1'" in str(answer["reason"])
            assert sent["X-Shoal-Receiver"] == other
        async with signed_session() as signed:
            for other in ("n2", "n3"):
                async with signed.get(f"{urls[other]}/v1/jobs/j-replayed") as missing:
                    assert missing.status == 404, "the replayed job ran"
        status, _, answer = await _post(session, urls["n1"], body, headers)
        assert status == 401
        assert "replayed" in str(answer["reason"])


def test_cross_node_replay_covers_every_header_the_receiver_acts_on() -> None:
    body = b'{"argv": ["true"]}'
    extra = {"X-Shoal-Cluster": "lab", "X-Shoal-Fence": "3:7", "X-Shoal-Forwarded": "n2"}
    headers = _signed("POST", "/v1/jobs", body, "n1", **extra)
    assert verify_request(SECRET, headers, "POST", "/v1/jobs", body, NonceCache()) == "cli-tester"
    changes = {
        "X-Shoal-Target": "n2",
        "X-Shoal-Cluster": "other",
        "X-Shoal-Fence": "3:8",
        "X-Shoal-Forwarded": "n3",
        "X-Shoal-Node": "cli-mallory",
    }
    for name, value in changes.items():
        with pytest.raises(AuthError, match="bad signature"):
            verify_request(SECRET, {**headers, name: value}, "POST", "/v1/jobs", body, NonceCache())
    dropped = {k: v for k, v in headers.items() if k != "X-Shoal-Fence"}
    with pytest.raises(AuthError, match="bad signature"):
        verify_request(SECRET, dropped, "POST", "/v1/jobs", body, NonceCache())


def test_cross_node_replay_of_a_v1_signature_only_from_this_host_or_the_previous_release() -> None:
    old = SimpleNamespace(node_id="old-1", meta={"version": "0.0.0"})
    new = SimpleNamespace(node_id="new-1", meta={"version": "0.1.0", "protocol": 2})
    view = SimpleNamespace(members=lambda: [old, new])
    assert local_or_previous("cli-x", "127.0.0.1", "198.18.0.2", view)
    assert local_or_previous("cli-x", "::1", "198.18.0.2", view)
    assert local_or_previous("cli-x", "198.18.0.2", "198.18.0.2", view)
    assert local_or_previous("old-1", "198.18.0.9", "198.18.0.2", view)
    assert not local_or_previous("new-1", "198.18.0.9", "198.18.0.2", view)
    assert not local_or_previous("cli-x", "198.18.0.9", "198.18.0.2", view)
    policy = AuthPolicy(
        secret=SECRET,
        node_id="n1",
        unbound_ok=lambda sender, remote: local_or_previous(sender, remote, None, view),
    )
    v1 = {k: v for k, v in _signed("GET", "/v1/status", b"", "n1").items()}
    del v1["X-Shoal-Target"]
    with pytest.raises(AuthError, match="previous release"):
        check_headers(policy, v1, time.time(), "198.18.0.9")
    assert check_headers(policy, v1, time.time(), "127.0.0.1") == "cli-tester"
    for target in ("", "n2"):
        with pytest.raises(AuthError, match="this is node 'n1'"):
            check_headers(policy, {**v1, "X-Shoal-Target": target}, time.time(), "127.0.0.1")
