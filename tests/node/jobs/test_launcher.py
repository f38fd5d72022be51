"""Supervisors start through the fork server, or spawned directly when it is off or gone; both
run jobs the same, leave no zombie, and closing the service leaves running jobs running."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from config import JobSettings
from node.jobs import JobService, parse_job_request
from tests.node.jobs.helpers import children_of, fork_servers, kill_group, process_state
from wal import WriteAheadLog


@asynccontextmanager
async def service(tmp_path: Path, *, fork_server: bool) -> AsyncIterator[JobService]:
    jobs = JobService("n", JobSettings(), tmp_path / "jobs", daemon_url=lambda: "http://x")
    jobs.use_fork_server = fork_server
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        await jobs.open(wal)
        try:
            yield jobs
        finally:
            await jobs.close()


async def run(jobs: JobService, job_id: str, script: str) -> tuple[str, int | None]:
    request = parse_job_request({"job_id": job_id, "argv": ["sh", "-c", script]})
    await jobs.start(request)
    entry = await jobs.wait(job_id, 30)
    return entry.state.value, (entry.result or {}).get("exit_code")


async def no_zombie_children() -> None:
    async with asyncio.timeout(10):
        while any(state == "Z" for _, state in children_of(os.getpid())):
            await asyncio.sleep(0.02)


async def test_direct_spawn_runs_jobs_and_reaps_its_supervisors(tmp_path: Path) -> None:
    async with service(tmp_path, fork_server=False) as jobs:
        assert fork_servers() == []
        assert await run(jobs, "a", "exit 4") == ("failed", 4)
        async with asyncio.timeout(10):
            while jobs.get("a").supervisor is not None:  # the watcher reaps it
                await asyncio.sleep(0.02)
        await no_zombie_children()


async def test_jobs_outlive_the_service_and_the_fork_server(tmp_path: Path) -> None:
    async with service(tmp_path, fork_server=True) as jobs:
        assert await run(jobs, "a", "exit 0") == ("succeeded", 0)
        await jobs.start(parse_job_request({"job_id": "b", "argv": ["sleep", "60"]}))
        pid = (jobs.get("b").started or {})["pid"]
        assert len(fork_servers()) == 1
    assert process_state(pid) not in (None, "Z"), "closing the service ended a job"
    await no_zombie_children()
    assert fork_servers() == [], "the fork server outlived the service"
    kill_group(pid)


async def test_a_dead_fork_server_falls_back_to_spawning(tmp_path: Path) -> None:
    async with service(tmp_path, fork_server=True) as jobs:
        forks = fork_servers()
        assert len(forks) == 1
        os.kill(forks[0], signal.SIGKILL)
        await asyncio.sleep(0.1)
        assert await run(jobs, "c", "echo fine") == ("succeeded", 0)
        assert (tmp_path / "jobs" / "c" / "stdout.log").read_bytes() == b"fine\n"
