"""SIGKILL of the coordinator (a `python -m node serve` child) during a run: the run finishes
once, each member's command started once, its results stored once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from node.jobs.roster import GANG_START_ATTEMPTS
from tests.node.daemons import FAST_ELECTION, FAST_MEMBERSHIP
from tests.node.runs.cluster import until

ROOT = Path(__file__).resolve().parents[3]
CRASH_DAEMON = Path(__file__).with_name("crash_daemon.py")
NAMES = ("k1", "k2", "k3")
SCRIPT = (
    "import os, sys, time\n"
    "rank = os.environ['SHOAL_NODE_RANK']\n"
    "open(sys.argv[1], 'a').write(f'started {rank}\\n')\n"
    "time.sleep(4)\n"
    "open('out.txt', 'w').write('done\\n')\n"
    "open(sys.argv[1], 'a').write(f'done {rank}\\n')\n"
)


def lines_of(marker: Path, kind: str) -> list[str]:
    """The marker's `kind` lines (`started` or `done`), one per member start or end."""
    text = marker.read_text() if marker.exists() else ""
    return sorted(line for line in text.splitlines() if line.startswith(kind))


def ran_once(marker: Path) -> None:
    """Each member's command ran to its end exactly once. A start the plan overtook (the gang
    picks again under the newer plan: node/jobs/gang_attempts.py) is stopped within its first
    seconds and never ends; at most one such start per member and extra attempt."""
    assert lines_of(marker, "done") == ["done 0", "done 1"], marker.read_text()
    starts = lines_of(marker, "started")
    assert {"started 0", "started 1"} <= set(starts), starts
    assert len(starts) <= 2 * GANG_START_ATTEMPTS, starts


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

    async def start(self, name: str, wrapper: tuple[str, ...] = ("-m", "node")) -> None:
        """Start daemon `name`: `python WRAPPER serve --config ...`."""
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
            sys.executable, *wrapper, "serve", "--config", str(path),
            cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
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


async def elected(children: Children) -> str:
    """The one coordinator all running children name."""
    found: dict[str, Any] = {}

    async def one() -> bool:
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

    await until(one, 90, "a coordinator among the children")
    return str(found["coordinator"])


async def submit(children: Children, via: str, marker: Path) -> str:
    body = {
        "argv": [sys.executable, "-c", SCRIPT, str(marker)],
        "nodes": 2,
        "results": ["out.txt"],
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{children.url(via)}/v1/runs", json=body) as response,
    ):
        assert response.status == 201
        return str((await response.json())["run_id"])


async def wait_done(children: Children, via: str, run_id: str) -> dict[str, Any]:
    record: dict[str, Any] = {}

    async def done() -> bool:
        try:
            answer = await get(f"{children.url(via)}/v1/runs/{run_id}")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        if answer.get("step") != "done":
            return False
        record.update(answer)
        return True

    await until(done, 120, f"run {run_id} to finish after the SIGKILL")
    return record


def stored_once(tmp_path: Path, record: dict[str, Any]) -> None:
    """Each uploaded key is in exactly one node's results directory, once; nothing else is."""
    keys = sorted(u["key"] for u in record["uploaded"])
    assert len(keys) == len(set(keys)) == 2
    found = sorted(
        str(p.relative_to(p.parents[3]))  # <data_dir>/results/runs/<run_id>/<node>/out.txt
        for p in tmp_path.glob(f"*/results/runs/{record['run_id']}/*/*")
        if p.is_file()
    )
    assert found == keys, (found, keys)


async def test_sigkill_of_the_coordinator_mid_run_finishes_the_run_once(tmp_path: Path) -> None:
    marker = tmp_path / "starts.txt"
    children = Children(tmp_path)
    try:
        for name in NAMES:
            await children.start(name)
        coordinator = await elected(children)
        other = next(n for n in NAMES if n != coordinator)
        run_id = await submit(children, other, marker)

        async def running() -> bool:
            record = await get(f"{children.url(other)}/v1/runs/{run_id}")
            return bool(record.get("step") == "running")

        await until(running, 60, "the run to start")
        children.kill(coordinator)
        await children.processes[coordinator].wait()
        await asyncio.sleep(1.0)
        await children.start(coordinator)
        record = await wait_done(children, other, run_id)
        assert record["state"] == "succeeded", json.dumps([record.get("job"), record["log"]])
        ran_once(marker)
        stored_once(tmp_path, record)
    finally:
        await children.close()


@pytest.mark.parametrize("point", ["before_job_post", "after_job_post"])
async def test_sigkill_of_the_coordinator_at_the_job_start_step(tmp_path: Path, point: str) -> None:
    """The coordinator dies exactly at the job-start step (before it asks for the job, or
    after the job started but before the step is stored): the next coordinator starts the job
    or finds it started, never twice; the run ends once with its results stored once."""
    marker = tmp_path / "starts.txt"
    crashed = tmp_path / "crashed"
    wrapper = (str(CRASH_DAEMON), "--crash-at", point, "--marker", str(crashed))
    children = Children(tmp_path)
    try:
        for name in NAMES:
            await children.start(name, wrapper)
        coordinator = await elected(children)
        other = next(n for n in NAMES if n != coordinator)
        run_id = await submit(children, other, marker)

        async def crashed_once() -> bool:
            return crashed.exists() and children.processes[coordinator].returncode is not None

        await until(crashed_once, 60, f"the coordinator {coordinator} to crash at {point}")
        assert crashed.read_text() == coordinator
        assert children.processes[coordinator].returncode == -signal.SIGKILL
        if point == "after_job_post":
            # the job API answered that both members started; their processes write the
            # marker a moment later (under load, after the coordinator's crash)
            async def both_started() -> bool:
                return len(lines_of(marker, "started")) >= 2

            await until(both_started, 30, "the two members started before the crash to write")
        starts_at_crash = lines_of(marker, "started")
        assert starts_at_crash == ([] if point == "before_job_post" else ["started 0", "started 1"])
        await children.start(coordinator, wrapper)
        record = await wait_done(children, other, run_id)
        assert record["state"] == "succeeded", json.dumps([record.get("job"), record["log"]])
        ran_once(marker)
        stored_once(tmp_path, record)
        steps = [line["step"] for line in record["log"]]
        assert steps.count("running") == 1, steps
        assert steps.count("done") == 1, steps
    finally:
        await children.close()
