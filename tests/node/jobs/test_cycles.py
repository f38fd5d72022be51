"""200 start/kill cycles leave no zombie and no process of any job behind."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.node.jobs.helpers import children_of, job_daemon, process_group_members

CYCLES = 200
AT_ONCE = 8


@pytest.mark.timeout(600)
async def test_no_zombie_after_200_start_kill_cycles(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        pgids: list[int] = []

        async def cycle(index: int) -> None:
            job = await client.start(["sh", "-c", "sleep 60 & sleep 60"], name=f"c{index}")
            pgids.append(job["pid"])
            await client.kill(job["job_id"], signal="TERM", grace_s=1)
            ended = await client.wait(job["job_id"])
            assert ended["state"] == "killed", ended

        for first in range(0, CYCLES, AT_ONCE):
            await asyncio.gather(*(cycle(i) for i in range(first, first + AT_ONCE)))
        assert len(pgids) == CYCLES
        async with asyncio.timeout(30):
            while [c for c in children_of(os.getpid()) if c[1] == "Z"] or any(
                pid for pid, _ in children_of(os.getpid())
            ):
                await asyncio.sleep(0.05)
        assert [c for c in children_of(os.getpid()) if c[1] == "Z"] == []
        survivors = [pid for pgid in pgids for pid in process_group_members(pgid)]
        assert survivors == [], "processes of killed jobs survived"
