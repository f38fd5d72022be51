"""Malformed raw HTTP requests cannot flood the daemon log with ERROR tracebacks."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiohttp import ClientSession
from aiohttp.http_exceptions import BadHttpMessage

from node.daemon import NodeDaemon
from node.logs import QuietProtocolLog
from tests.node.daemons import test_settings

GARBAGE = (
    b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n",
    b"\x16\x03\x01\x02\x00garbage request line\r\n\r\n",
    b"GET /v1/status HTTP/9.9.9\r\n\r\n",
    b"GET / HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
)


async def _send_raw(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_garbage_requests_log_no_error_and_the_daemon_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    async with NodeDaemon(test_settings(tmp_path, "flood")) as daemon:
        for _ in range(25):
            for payload in GARBAGE:
                answer = await _send_raw(daemon.port, payload)
                assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")) or not answer, answer
        async with (
            ClientSession() as session,
            session.get(f"http://127.0.0.1:{daemon.port}/v1/health") as response,
        ):
            assert response.status == 200
    server_records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert not [r for r in server_records if r.levelno >= logging.ERROR]
    assert not [r for r in server_records if r.exc_info]
    debug = [r for r in server_records if r.levelno == logging.DEBUG]
    assert 1 <= len(debug) <= 10, f"{len(debug)} DEBUG lines for 100 refused requests"


def test_refusals_are_rate_limited_and_summarised(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logger = logging.getLogger("test.quiet")
    quiet = QuietProtocolLog(logger, debug_per_s=1.0, summary_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="test.quiet")
    for step in range(130):
        now[0] = step * 0.5
        quiet.exception("Error handling request", exc_info=BadHttpMessage("bad"))
    levels = [r.levelno for r in caplog.records]
    assert levels.count(logging.DEBUG) == 65
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["121 malformed HTTP request(s) refused in the last 60 s"]
    assert quiet.refused_total == 130
    caplog.clear()
    quiet.exception("Unhandled exception", exc_info=RuntimeError("a real bug"))
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
