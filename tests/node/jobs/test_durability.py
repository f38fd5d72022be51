"""Every start and kill is in the WAL; a start cut off by a crash runs once at the next start;
a job whose supervisor dies without recording its end is `lost` and its processes are killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

from tests.node.jobs.helpers import job_daemon, process_state
from wal import WriteAheadLog


def wal_entries(data_dir: Path) -> list[tuple[str, str, dict[str, Any]]]:
    with sqlite3.connect(data_dir / "wal" / "wal.db") as db:
        query = "SELECT entry_type, state, payload FROM entries WHERE entry_type LIKE 'job.%'"
        rows = db.execute(f"{query} ORDER BY id").fetchall()
    return [(kind, state, json.loads(payload)) for kind, state, payload in rows]


async def test_starts_and_kills_are_committed_wal_operations(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.start(["sleep", "30"], job_id="w1")
        await client.kill("w1", signal="INT", grace_s=2)
        ended = await client.wait("w1")
        assert ended["state"] == "killed"
        assert ended["signal"] == "SIGINT"
        assert job["job_id"] == "w1"
    entries = wal_entries(tmp_path / "n1")
    assert [(kind, state) for kind, state, _ in entries] == [
        ("job.start", "committed"),
        ("job.kill", "committed"),
    ]
    assert entries[0][2]["request"]["argv"] == ["sleep", "30"]
    assert entries[0][2]["sender"] == "cli-tester"
    assert entries[1][2] == {
        "job_id": "w1",
        "signal": "SIGINT",
        "grace_s": 2.0,
        "sender": "cli-tester",
    }


async def test_a_job_of_a_daemon_started_with_sigint_ignored_still_dies_of_sigint(
    tmp_path: Path,
) -> None:
    """`nohup shoal serve &` starts the daemon with SIGINT ignored; its jobs must not inherit
    that, or `kill --signal INT` runs on to the SIGKILL after the grace."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        async with job_daemon(tmp_path) as client:
            await client.start(["sleep", "30"], job_id="ignored-int")
            await client.kill("ignored-int", signal="INT", grace_s=20)
            ended = await asyncio.wait_for(client.wait("ignored-int"), 10)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ended["state"] == "killed"
    assert ended["signal"] == "SIGINT"


async def test_a_start_cut_off_by_a_crash_runs_once_on_restart(tmp_path: Path) -> None:
    wal_dir = tmp_path / "n1" / "wal"
    wal_dir.mkdir(parents=True)
    request: dict[str, object] = {
        "job_id": "r1",
        "name": "r1",
        "argv": ["sh", "-c", "echo ran >> ../../ran.txt; echo once"],
        "env": {},
        "cwd": None,
        "timeout_s": None,
        "nodes": 1,
        "role": "any",
        "env_from": None,
        "gang": None,
    }
    async with WriteAheadLog(wal_dir / "wal.db") as wal:
        await wal.append("job.start", {"job_id": "r1", "request": request}, key="job.start.r1")
    async with job_daemon(tmp_path) as client:
        done = await client.wait("r1")
        assert done["state"] == "succeeded", done
        assert await client.log("r1") == b"once\n"
    async with job_daemon(tmp_path) as client:
        assert (await client.wait("r1"))["state"] == "succeeded"
    assert (tmp_path / "n1" / "jobs" / "ran.txt").read_text() == "ran\n", "ran exactly once"
    assert [(k, s) for k, s, _ in wal_entries(tmp_path / "n1")] == [("job.start", "committed")]


async def test_a_job_whose_supervisor_dies_is_lost_and_its_processes_are_killed(
    tmp_path: Path,
) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.start(["sleep", "60"])
        job_dir = tmp_path / "n1" / "jobs" / job["job_id"]
        supervisor = json.loads((job_dir / "supervisor.json").read_text())["supervisor_pid"]
        os.kill(supervisor, signal.SIGKILL)
        ended = await client.wait(job["job_id"])
        assert ended["state"] == "lost", ended
        assert ended["exit_code"] is None
        assert "never observed" in ended["reason"]
        async with asyncio.timeout(10):
            while process_state(job["pid"]) not in (None, "Z"):
                await asyncio.sleep(0.02)


async def test_unreadable_job_files_show_in_health_until_they_are_readable(
    tmp_path: Path,
) -> None:
    async def jobs_component() -> dict[str, Any]:
        _, health = await client.call("GET", "/v1/health")
        found: dict[str, Any] = next(c for c in health["components"] if c["name"] == "jobs")
        return found

    async with job_daemon(tmp_path) as client:
        job = await client.start(["sleep", "60"])
        blocker = tmp_path / "n1" / "jobs" / job["job_id"] / "result.json"
        blocker.mkdir()  # reading the result now fails with IsADirectoryError
        async with asyncio.timeout(30):
            while (component := await jobs_component())["status"] != "degraded":
                await asyncio.sleep(0.1)
        assert "watching job files failed" in component["message"]
        blocker.rmdir()
        async with asyncio.timeout(30):
            while (await jobs_component())["status"] != "healthy":
                await asyncio.sleep(0.1)
        assert (await client.call("GET", f"/v1/jobs/{job['job_id']}"))[1]["state"] == "running"
