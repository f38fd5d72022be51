"""A real daemon on loopback with a cluster secret, a signed client, and /proc helpers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from config import signing_middleware
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings

SECRET = b"0123456789abcdef0123456789abcdef"


def write_secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


@dataclass
class JobClient:
    """A signed session against one daemon."""

    base: str
    session: aiohttp.ClientSession

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.session.request(method, f"{self.base}{path}", **kwargs) as response:
            return response.status, await response.json()

    async def start(self, argv: list[str], **fields: Any) -> dict[str, Any]:
        status, body = await self.call("POST", "/v1/jobs", json={"argv": argv, **fields})
        assert status in (200, 201), body
        assert isinstance(body, dict)
        return body

    async def wait(self, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        status, body = await self.call("GET", f"/v1/jobs/{job_id}/wait?timeout_s={timeout_s}")
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    async def kill(self, job_id: str, **fields: Any) -> dict[str, Any]:
        status, body = await self.call("POST", f"/v1/jobs/{job_id}/kill", json=fields)
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    async def log(self, job_id: str, stream: str = "stdout", **query: Any) -> bytes:
        params = {"stream": stream, **{k: str(v) for k, v in query.items()}}
        url = f"{self.base}/v1/jobs/{job_id}/logs"
        async with self.session.get(url, params=params) as response:
            assert response.status == 200, await response.text()
            return await response.read()


def signed_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=(signing_middleware(SECRET, "cli-tester"),))


@contextlib.asynccontextmanager
async def job_daemon(
    tmp_path: Path, flags: dict[str, Any] | None = None, name: str = "n1"
) -> AsyncIterator[JobClient]:
    """An in-process daemon with a secret; every job still running at the end is killed."""
    settings = test_settings(tmp_path, name, secret_file=write_secret(tmp_path), **(flags or {}))
    async with NodeDaemon(settings) as daemon, signed_session() as session:
        client = JobClient(f"http://127.0.0.1:{daemon.port}", session)
        try:
            yield client
        finally:
            _, listing = await client.call("GET", "/v1/jobs?state=running")
            for job in listing["jobs"]:
                await client.kill(job["job_id"], signal="KILL", grace_s=0)
            for job in listing["jobs"]:
                await client.wait(job["job_id"])
            await asyncio.sleep(0.2)  # the watcher reaps the supervisors it started


def process_state(pid: int) -> str | None:
    """The /proc state letter of `pid` (R, S, Z, ...), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[0]


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append((int(entry.name), fields[0]))
    return found


def fork_servers() -> list[int]:
    """Children of this process that are fork servers."""
    found = []
    for pid, _ in children_of(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"--serve" in cmdline.split(b"\0"):
            found.append(pid)
    return found


def process_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


async def agreed(clients: dict[str, JobClient], timeout_s: float = 60.0) -> None:
    """Until every node of `clients` has the same coordinator and plan, sees them all alive,
    and that plan ranks all of them for training (a first plan made before the last node
    joined ranks fewer)."""
    deadline = time.monotonic() + timeout_s
    seen: list[Any] = []
    while time.monotonic() < deadline:
        seen = [(await c.call("GET", "/v1/status"))[1] for c in clients.values()]
        fences = {(s["coordinator"], s["term"], s["plan_version"]) for s in seen}
        alive = {s["members"]["alive"] for s in seen}
        if len(fences) == 1 and None not in next(iter(fences)) and alive == {len(clients)}:
            _, plan = await next(iter(clients.values())).call("GET", "/v1/plan")
            if len(plan["plan"]["training_ranks"]) == len(clients):
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the cluster did not agree on a plan that ranks every node: {seen}")
