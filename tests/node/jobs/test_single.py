"""One node's jobs through the HTTP API of a real daemon: exit codes, logs, kill, files."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import aiohttp

from tests.node.jobs.helpers import job_daemon, process_group_members


async def test_exit_codes_zero_three_and_a_signal_death(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        ok = await client.start(["sh", "-c", "echo hello; echo oops >&2"], name="ok")
        three = await client.start(["sh", "-c", "exit 3"])
        segv = await client.start(["sh", "-c", "kill -SEGV $$"])
        ok, three, segv = [await client.wait(j["job_id"]) for j in (ok, three, segv)]
        assert (ok["state"], ok["exit_code"], ok["signal"]) == ("succeeded", 0, None)
        assert (three["state"], three["exit_code"]) == ("failed", 3)
        assert (segv["state"], segv["exit_code"], segv["signal"]) == ("failed", None, "SIGSEGV")
        assert await client.log(ok["job_id"]) == b"hello\n"
        assert await client.log(ok["job_id"], "stderr") == b"oops\n"
        assert ok["log_bytes"] == {"stdout": 6, "stderr": 5}
        assert ok["name"] == "ok" and ok["node"] == "n1" and ok["argv"][0] == "sh"
