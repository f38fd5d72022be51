"""A peer whose clock is further off than the signature window is named, on both sides, in the
log and in /v1/status (`clock skew with PEER: +412 s; signatures refused; fix time sync`),
instead of a bare 401. Only a request signed with the cluster secret counts as a peer's."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from aiohttp import ClientSession

from config import CLOCK_SKEWS, signed_headers, signing_middleware
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings

SECRET = b"0123456789abcdef0123456789abcdef"
OFFSET_S = 412.0


async def test_a_peer_with_a_skewed_clock_is_named_on_both_sides(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    caplog.set_level(logging.WARNING)
    # the peer is a node `a` knows (a voter): a sender must be a known node or a client
    settings = test_settings(tmp_path, "a", secret_file=secret, voters=["a", "skewed-b"])
    async with NodeDaemon(settings) as daemon:
        base = f"http://127.0.0.1:{daemon.port}"
        server_side, client_side = "skewed-b", f"127.0.0.1:{daemon.port}"
        for peer in (server_side, client_side, "forger"):
            CLOCK_SKEWS.clear(peer)
        late = signing_middleware(SECRET, server_side, clock=lambda: time.time() - OFFSET_S)
        async with (
            ClientSession(middlewares=(late,)) as skewed,
            skewed.get(f"{base}/v1/status") as response,
        ):
            body = await response.json()
        assert response.status == 401
        assert body["error"] == "clock_skew"
        assert re.search(r"your clock is -41[23] s", body["reason"]), body
        assert "fix time sync" in body["reason"]
        tail = " s; signatures refused; fix time sync"
        # the sending side: the peer (the daemon) is 412 s ahead of its clock
        own = CLOCK_SKEWS.lines(time.time())
        assert any(re.fullmatch(f"clock skew with {client_side}: \\+41[23]{tail}", n) for n in own)
        # a request that only claims to be a peer (bad signature) is a bare 401, not a skew
        forged = signed_headers(b"not-the-secret-0123456789abcdef", "forger", "GET", "/v1/status")
        forged["X-Shoal-Timestamp"] = str(int(time.time() - OFFSET_S))
        async with ClientSession() as session:
            async with session.get(f"{base}/v1/status", headers=forged) as response:
                assert response.status == 401
                assert (await response.json())["error"] == "unauthorized"
            signer = signing_middleware(SECRET, "cli-operator")
            async with (
                ClientSession(middlewares=(signer,)) as signed,
                signed.get(f"{base}/v1/status") as response,
            ):
                notes = (await response.json())["notes"]
        # the receiving node: the peer's clock is 412 s behind its own
        assert any(re.fullmatch(f"clock skew with {server_side}: -41[23]{tail}", n) for n in notes)
        assert not any("forger" in note for note in notes)
        logged = [r.getMessage() for r in caplog.records if "clock skew with" in r.getMessage()]
        assert any(server_side in line for line in logged), logged
        assert any(client_side in line for line in logged), logged
        # once its clock is right, the peer is no longer listed
        fixed = signing_middleware(SECRET, server_side)
        async with (
            ClientSession(middlewares=(fixed,)) as session,
            session.get(f"{base}/v1/status") as response,
        ):
            assert response.status == 200
            notes = (await response.json())["notes"]
        assert not any(server_side in note for note in notes)
        assert not any(client_side in note for note in notes)
