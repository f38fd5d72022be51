"""SIGKILL of the coordinator (a `python -m node serve` child) during a run: the run finishes
once, each member's command started once, its results stored once."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.node.daemons import FAST_ELECTION, FAST_MEMBERSHIP
from tests.node.runs.cluster import until

ROOT = Path(__file__).resolve().parents[3]
NAMES = ("k1", "k2", "k3")
SCRIPT = (
    "import sys, time\n"
    "open(sys.argv[1], 'a').write('started\\n')\n"
    "time.sleep(4)\n"
    "open('out.txt', 'w').write('done\\n')\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Children:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.ports = {name: free_port() for name in NAMES}
        self.processes: dict[str, asyncio.subprocess.Process] = {}

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    async def start(self, name: str) -> None:
        timeouts = {
            key.split(".", 1)[1]: value
            for key, value in {**FAST_ELECTION, **FAST_MEMBERSHIP}.items()
        }
        config = {
            "node_id": name,
            "port": self.ports[name],
            "data_dir": str(self.tmp_path / name),
            "mdns": False,
            "cluster_name": f"k{os.getpid()}",
            "voters": list(NAMES),
            "seeds": [f"127.0.0.1:{p}" for n, p in self.ports.items() if n != name],
            "timeouts": timeouts,
        }
        path = self.tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        log = (self.tmp_path / f"{name}.log").open("ab")
        self.processes[name] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "node", "serve", "--config", str(path),
            cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
        log.close()

    def kill(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGKILL)

    async def close(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.kill()
            await process.wait()


async def get(url: str) -> Any:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(url) as response,
    ):
        return await response.json()


async def test_sigkill_of_the_coordinator_mid_run_finishes_the_run_once(tmp_path: Path) -> None:
    marker = tmp_path / "starts.txt"
    children = Children(tmp_path)
    try:
        for name in NAMES:
            await children.start(name)
        found: dict[str, Any] = {}

        async def elected() -> bool:
            seen = set()
            for name in children.processes:
                if children.processes[name].returncode is not None:
                    continue
                try:
                    seen.add((await get(f"{children.url(name)}/v1/status"))["coordinator"])
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    return False
            if len(seen) == 1 and None not in seen:
                found["coordinator"] = seen.pop()
                return found["coordinator"] in children.processes
            return False

        await until(elected, 90, "a coordinator among the children")
        coordinator = found["coordinator"]
        other = next(n for n in NAMES if n != coordinator)
        body = {
            "argv": [sys.executable, "-c", SCRIPT, str(marker)],
            "nodes": 2,
            "results": ["out.txt"],
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{children.url(other)}/v1/runs", json=body) as response,
        ):
            assert response.status == 201
            run_id = (await response.json())["run_id"]

        async def running() -> bool:
            record = await get(f"{children.url(other)}/v1/runs/{run_id}")
            return bool(record.get("step") == "running")

        await until(running, 60, "the run to start")
        children.kill(coordinator)
        await children.processes[coordinator].wait()
        await asyncio.sleep(1.0)
        await children.start(coordinator)
        record: dict[str, Any] = {}

        async def done() -> bool:
            try:
                answer = await get(f"{children.url(other)}/v1/runs/{run_id}")
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return False
            record.update(answer)
            return bool(answer.get("step") == "done")

        await until(done, 120, f"run {run_id} to finish after the SIGKILL")
        assert record["state"] == "succeeded", record
        assert marker.read_text().splitlines() == ["started", "started"]
        keys = [u["key"] for u in record["uploaded"]]
        assert len(keys) == len(set(keys)) == 2
    finally:
        await children.close()
