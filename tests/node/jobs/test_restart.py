"""A daemon SIGKILLed while five jobs run loses nothing: jobs keep running, the restarted
daemon knows every exit code exactly, every log is complete, a job that outlived the daemon is
killed through the new one, and a job whose supervisor died unobserved is `lost`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.waiting import async_wait_until
from tests.node.jobs.helpers import JobClient, process_state, signed_session, write_secret

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 30.0
REATTACH_S = 2.0

LINES = "for i in $(seq 1 {n}); do echo line-$i; done"
JOBS = {
    "ends-ok": f"{LINES.format(n=2000)}; sleep 0.3; exit 0",
    "ends-7": f"{LINES.format(n=10)}; sleep 0.3; echo bye >&2; exit 7",
    "ends-by-signal": "sleep 0.3; kill -KILL $$",
    "outlives-restart": f"sleep 0.3; {LINES.format(n=50)}; sleep 120",
    "dies-unobserved": "sleep 30",
}
EXPECTED = {
    "ends-ok": ("succeeded", 0, None),
    "ends-7": ("failed", 7, None),
    "ends-by-signal": ("failed", None, "SIGKILL"),
    "outlives-restart": ("killed", None, "SIGTERM"),
    "dies-unobserved": ("lost", None, None),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def lines(n: int) -> bytes:
    return b"".join(f"line-{i}\n".encode() for i in range(1, n + 1))


@contextlib.asynccontextmanager
async def daemon_process(
    data_dir: Path, port: int, secret: Path, log_path: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "node",
            "serve",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--node-id",
            "n1",
            "--no-mdns",
            "--secret-file",
            str(secret),
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(START_TIMEOUT_S):
            while True:
                assert process.returncode is None, log_path.read_text()
                try:
                    async with session.get(f"http://127.0.0.1:{port}/v1/health") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.02)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


@pytest.mark.timeout(180)
async def test_sigkill_of_the_daemon_loses_no_exit_code_and_no_log_line(tmp_path: Path) -> None:
    data_dir, port, secret = tmp_path / "data", free_port(), write_secret(tmp_path)
    log_path = tmp_path / "daemon.log"
    async with signed_session() as session:
        client = JobClient(f"http://127.0.0.1:{port}", session)
        async with daemon_process(data_dir, port, secret, log_path) as daemon:
            started = {
                name: await client.start(["sh", "-c", script], job_id=name, name=name)
                for name, script in JOBS.items()
            }
            daemon.kill()
            await daemon.wait()
        assert all(job["state"] == "running" for job in started.values())
        supervisor_file = data_dir / "jobs" / "dies-unobserved" / "supervisor.json"
        supervisor_pid = json.loads(supervisor_file.read_text())["supervisor_pid"]
        os.kill(supervisor_pid, signal.SIGKILL)
        # most jobs end while no daemon runs
        jobs_dir = data_dir / "jobs"
        for name in ("ends-ok", "ends-7", "ends-by-signal"):
            result = jobs_dir / name / "result.json"
            await async_wait_until(result.exists, 30, message=f"job {name} to record its end")
        outlives_log = jobs_dir / "outlives-restart" / "stdout.log"
        await async_wait_until(
            lambda: outlives_log.read_bytes() == lines(50),
            30,
            message="job outlives-restart to print its 50 lines",
        )
        await async_wait_until(
            lambda: process_state(supervisor_pid) in (None, "Z"),
            30,
            message=f"the SIGKILLed supervisor {supervisor_pid} of dies-unobserved to end",
        )
        assert process_state(started["outlives-restart"]["pid"]) not in (None, "Z")
        async with daemon_process(data_dir, port, secret, log_path):
            attached_by = time.monotonic() + REATTACH_S
            records = {}
            for name in JOBS:
                status, records[name] = await client.call("GET", f"/v1/jobs/{name}")
                assert status == 200
            assert time.monotonic() < attached_by
            for name in ("ends-ok", "ends-7", "ends-by-signal"):
                record = records[name]
                assert (record["state"], record["exit_code"], record["signal"]) == EXPECTED[name]
            assert records["outlives-restart"]["state"] == "running"
            await client.kill("outlives-restart", signal="TERM", grace_s=5)
            ended = {name: await client.wait(name) for name in JOBS}
            for name, record in ended.items():
                assert (record["state"], record["exit_code"], record["signal"]) == EXPECTED[name]
            assert "never observed" in ended["dies-unobserved"]["reason"]
            # its orphaned process was killed; re-parented to init, init reaps it
            assert process_state(started["dies-unobserved"]["pid"]) in (None, "Z")
            assert await client.log("ends-ok") == lines(2000)
            assert await client.log("ends-7") == lines(10)
            assert await client.log("ends-7", "stderr") == b"bye\n"
            assert await client.log("outlives-restart") == lines(50)
