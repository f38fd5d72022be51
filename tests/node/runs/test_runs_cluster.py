"""Runs on a loopback cluster of three daemons: FIFO one after another with results collected
(hashes checked), the max-duration safety stop, cancel, and a coordinator failover mid-run."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.node.runs.cluster import Cluster, post, running, until

WRITE_RESULT = (
    "import os, sys, time\n"
    "open(sys.argv[1], 'a').write(os.environ.get('SHOAL_NODE_ID', '?') + '\\n')\n"
    "time.sleep(float(sys.argv[2]))\n"
    "open('out.txt', 'w').write('result of ' + sys.argv[3] + '\\n')\n"
)


def run_body(marker: Path, sleep_s: float, name: str, **extra: Any) -> dict[str, Any]:
    argv = [sys.executable, "-c", WRITE_RESULT, str(marker), str(sleep_s), name]
    return {"argv": argv, "name": name, "nodes": 2, "results": ["out.txt"], **extra}


async def get(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.json()


async def submit(url: str, body: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """POST a run, again while the node answers 503 (no coordinator holds the lease for a
    moment: nothing was created); its record."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, record = await post(url, body)
        if status != 503 or time.monotonic() > deadline:
            assert status == 201, (status, record)
            return dict(record)
        await asyncio.sleep(0.2)


async def wait_done(cluster: Cluster, run_id: str, timeout_s: float) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    async def done() -> bool:
        for url in cluster.urls:
            try:
                record = await get(f"{url}/v1/runs/{run_id}")
            except aiohttp.ClientError:
                continue
            if record.get("step") == "done":
                found.append(record)
                return True
        return False

    await until(done, timeout_s, f"run {run_id} to end")
    return found[-1]


async def runs_rounds(port: int) -> float:
    """How many rounds the node's runs loop has driven as coordinator (its `runs` health)."""
    health = await get(f"http://127.0.0.1:{port}/v1/health")
    runs = [c for c in health["components"] if c["name"] == "runs"]
    return float(runs[0]["metrics"].get("rounds", 0.0)) if runs else 0.0


def stored(cluster: Cluster, key: str) -> list[Path]:
    return [p for p in cluster.tmp_path.glob(f"*/results/{key}") if p.is_file()]


async def test_three_runs_run_one_after_another_and_leave_their_results(tmp_path: Path) -> None:
    marker = tmp_path / "starts.txt"
    async with running(tmp_path) as cluster:
        url = cluster.urls[1]
        ids = []
        for name in ("first", "second", "third"):
            status, record = await post(f"{url}/v1/runs", run_body(marker, 0.3, name))
            assert status == 201, record
            assert record["state"] == "queued"
            ids.append(record["run_id"])
        records = [await wait_done(cluster, run_id, 60) for run_id in ids]
        for earlier, later in itertools.pairwise(records):
            assert earlier["ended_at"] <= later["started_at"], (earlier, later)
        for record in records:
            assert record["state"] == "succeeded", record
            assert len(record["uploaded"]) == 2
            for upload in record["uploaded"]:
                assert upload["key"] == f"runs/{record['run_id']}/{upload['node']}/out.txt"
                (path,) = stored(cluster, upload["key"])
                content = path.read_bytes()
                assert content == f"result of {record['name']}\n".encode()
                assert upload["hash"] == hashlib.sha256(content).hexdigest()
        assert len(marker.read_text().splitlines()) == 6  # 3 runs x 2 members, each started once
        listing = await get(f"{cluster.urls[0]}/v1/runs")
        assert [r["run_id"] for r in listing["runs"]] == ids
        audits = [await get(f"{one}/v1/audit?kind=run") for one in cluster.urls]
        steps = sorted((e["at"], e["id"], e) for audit in audits for e in audit["entries"])
        first = [e["detail"]["step"] for _, _, e in steps if e["subject"] == ids[0]]
        assert first[0] == "queued", first  # the audit trail holds each step the run took
        assert first[-1] == "done", first
        assert "running" in first


async def test_max_duration_kills_a_hanging_run_and_still_collects(tmp_path: Path) -> None:
    marker = tmp_path / "starts.txt"
    hang = (
        "import sys, time\n"
        "open('out.txt', 'w').write('partial\\n')\n"
        "open(sys.argv[1], 'a').write('x\\n')\n"
        "time.sleep(600)\n"
    )
    async with running(tmp_path) as cluster:
        body = {
            "argv": [sys.executable, "-c", hang, str(marker)],
            "nodes": 2,
            "results": ["out.txt"],
            "max_duration_s": 1.0,
        }
        status, record = await post(f"{cluster.urls[0]}/v1/runs", body)
        assert status == 201
        done = await wait_done(cluster, record["run_id"], 60)
        assert done["state"] == "killed"
        assert done["safety_stop"] is True
        assert [stored(cluster, u["key"])[0].read_text() for u in done["uploaded"]] == [
            "partial\n",
            "partial\n",
        ]


async def test_cancel_removes_a_queued_run_and_kills_a_running_one(tmp_path: Path) -> None:
    marker = tmp_path / "starts.txt"
    async with running(tmp_path) as cluster:
        url = cluster.urls[2]
        _, first = await post(f"{url}/v1/runs", run_body(marker, 600, "long"))
        _, second = await post(f"{url}/v1/runs", run_body(marker, 0.1, "queued"))
        status, cancelled = await post(f"{url}/v1/runs/{second['run_id']}/cancel", {})
        assert status == 200
        assert cancelled["state"] == "cancelled"

        async def started() -> bool:
            return bool((await get(f"{url}/v1/runs/{first['run_id']}")).get("step") == "running")

        await until(started, 30, "the first run to start")
        status, _ = await post(f"{url}/v1/runs/{first['run_id']}/cancel", {})
        assert status == 200
        done = await wait_done(cluster, first["run_id"], 60)
        assert done["state"] == "cancelled"
        status, again = await post(f"{url}/v1/runs/{first['run_id']}/cancel", {})
        assert status == 409
        assert again["error"] == "run_ended"


async def test_a_coordinator_failover_mid_run_finishes_it_once(tmp_path: Path) -> None:
    marker = tmp_path / "starts.txt"
    async with running(tmp_path) as cluster:
        coordinator = await cluster.elected()
        other = next(n for n in cluster.daemons if n != coordinator)
        url = f"http://127.0.0.1:{cluster.ports[other]}"
        record = await submit(f"{url}/v1/runs", run_body(marker, 3.0, "survivor"))

        async def started() -> bool:
            return bool((await get(f"{url}/v1/runs/{record['run_id']}")).get("step") == "running")

        await until(started, 30, "the run to start")
        before = {name: await runs_rounds(cluster.ports[name]) for name in cluster.daemons}
        await cluster.stop(coordinator)
        successor = await cluster.elected()

        async def successor_drives() -> bool:
            return await runs_rounds(cluster.ports[successor]) > before[successor]

        # the new coordinator drives the run while its job node (the old coordinator) is away
        await until(successor_drives, 30, f"{successor}'s runs loop to drive the run")
        await cluster.start(coordinator)
        done = await wait_done(cluster, record["run_id"], 90)
        assert done["state"] == "succeeded", done
        assert len(marker.read_text().splitlines()) == 2  # each member started exactly once
        keys = [u["key"] for u in done["uploaded"]]
        assert len(keys) == len(set(keys)) == 2
