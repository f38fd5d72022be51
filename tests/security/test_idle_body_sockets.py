"""Finding 2: sockets that send made-up signature headers and then a body one byte at a time
stalled every signed request (they held the node's 4 body-read permits without a deadline).
Now a request without a body needs no permit, one client holds at most its share of them, and
a body must arrive within its deadline (408)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

import node.connections
import node.limits
from node.daemon import NodeDaemon
from node.limits import MAX_SMALL_BODY_READS_PER_CLIENT
from tests.node.daemons import test_settings
from tests.node.jobs.helpers import signed_session, write_secret
from tests.security.attackers import slow_bodies

ANSWER_BOUND_S = 5.0
"""Far below the deadline of a slow body (so an answer within it came while they were held),
far above what a loaded 2-core machine needs for a GET."""


@asynccontextmanager
async def _daemon(tmp_path: Path) -> AsyncIterator[int]:
    settings = test_settings(tmp_path, "n1", secret_file=write_secret(tmp_path))
    async with NodeDaemon(settings) as daemon:
        yield daemon.port


async def _timed(session: aiohttp.ClientSession, method: str, url: str, **kw: object) -> float:
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=4 * ANSWER_BOUND_S)
    async with session.request(method, url, timeout=timeout, **kw) as answer:  # type: ignore[arg-type]
        assert answer.status < 500, await answer.text()
    return time.monotonic() - started


async def test_idle_body_sockets_do_not_stall_signed_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.limits, "BODY_READ_BASE_S", 30.0)  # they stay for the test
    async with _daemon(tmp_path) as port, signed_session() as session:
        base = f"http://127.0.0.1:{port}"
        async with slow_bodies(port, 4 + MAX_SMALL_BODY_READS_PER_CLIENT) as attack:
            await asyncio.sleep(0.5)
            assert attack.open_count() == 4 + MAX_SMALL_BODY_READS_PER_CLIENT
            took = await _timed(session, "GET", f"{base}/v1/status")
            assert took < ANSWER_BOUND_S, took
            # a signed POST from another client address gets a permit of its own
            other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
            async with aiohttp.ClientSession(
                connector=other, middlewares=session._middlewares
            ) as elsewhere:
                took = await _timed(elsewhere, "POST", f"{base}/v1/jobs", json={"argv": ["true"]})
            assert took < ANSWER_BOUND_S, took
            assert attack.open_count() == 4 + MAX_SMALL_BODY_READS_PER_CLIENT


async def test_idle_body_sockets_are_answered_408_at_their_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.limits, "BODY_READ_BASE_S", 0.5)
    monkeypatch.setattr(node.connections, "HEAD_DEADLINE_S", 1.0)  # then the lingering ends
    async with _daemon(tmp_path) as port, slow_bodies(port, 4, every_s=0.2) as attack:
        deadline = time.monotonic() + 15.0
        while attack.open_count() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert attack.open_count() == 0, "a slow body outlived its deadline"
    assert len(attack.answers) == 4
    for answer in attack.answers:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body_timeout" in answer
