"""Job API latency: a `shoal serve` child on loopback with a cluster secret, driven by the Python
job client (node.jobs.client), against `subprocess.Popen` of the same command in this process.

Prints one JSON document: start-to-running latency (p50/p99) and start/kill cycles per second
for both, the log follow latency (a line written by the job to the line received, p50/p99),
their differences and ratios, and whether the targets hold (start p50 <= 20 ms over Popen,
follow p99 <= 200 ms).
Usage: python bench/jobs_bench.py [--starts 50] [--cycles 30] [--lines 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from node.errors import JobEndedError  # noqa: E402
from node.jobs.client import (  # noqa: E402
    poll_status_async,
    remove_job_async,
    start_job_async,
    stream_logs_async,
    terminate_async,
    wait_for_completion_async,
)
from node.jobs.specs import JobSpec, make_job_state  # noqa: E402
from node.jobs.transport import ENDED_STATES  # noqa: E402
from tests.node.jobs.client_daemon import ServedNode, served_node  # noqa: E402

COMMAND = ("sleep", "30")
START_TARGET_MS_OVER_POPEN = 20.0
FOLLOW_TARGET_P99_MS = 200.0


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values_s: list[float]) -> dict[str, float]:
    values = [v * 1000 for v in values_s]
    return {
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
        "n": len(values),
    }


def popen_start_latencies(count: int) -> list[float]:
    """Seconds until Popen returns (the child has exec'd: it is running), for each start."""
    latencies = []
    for _ in range(count):
        began = time.perf_counter()
        child = subprocess.Popen(COMMAND)
        latencies.append(time.perf_counter() - began)
        child.kill()
        child.wait()
    return latencies


def popen_cycles_per_s(count: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        child = subprocess.Popen(COMMAND)
        child.kill()
        child.wait()
    return count / (time.perf_counter() - began)


async def until_running(state: dict[str, Any]) -> None:
    while state["status"] not in ("running", *ENDED_STATES):
        await poll_status_async(state)


async def kill_and_wait(state: dict[str, Any]) -> None:
    await terminate_async(state, grace_s=0.0)
    with contextlib.suppress(JobEndedError):
        await wait_for_completion_async(state, poll_interval=5.0)
    await remove_job_async(state)


async def job_start_latencies(node: ServedNode, count: int) -> list[float]:
    """Seconds from the start request until the job's record says running, for each start."""
    latencies = []
    for _ in range(count):
        state = make_job_state()
        began = time.perf_counter()
        await start_job_async(node.deploy(), JobSpec(COMMAND), state)
        await until_running(state)
        latencies.append(time.perf_counter() - began)
        await kill_and_wait(state)
    return latencies


async def status_round_trips(node: ServedNode, count: int) -> list[float]:
    """Seconds per signed GET of one job's record: the client's share of every call."""
    state = make_job_state()
    await start_job_async(node.deploy(), JobSpec(("true",)), state)
    latencies = []
    for _ in range(count):
        began = time.perf_counter()
        await poll_status_async(state)
        latencies.append(time.perf_counter() - began)
    return latencies


async def job_cycles_per_s(node: ServedNode, count: int) -> float:
    """Start, running, kill (grace 0), ended, delete: cycles per second."""
    began = time.perf_counter()
    for _ in range(count):
        state = make_job_state()
        await start_job_async(node.deploy(), JobSpec(COMMAND), state)
        await until_running(state)
        await kill_and_wait(state)
    return count / (time.perf_counter() - began)


async def follow_latency(node: ServedNode, lines: int) -> list[float]:
    """Seconds from a line's write by the job (CLOCK_MONOTONIC, shared by the processes of
    one host) to its arrival through a followed log."""
    program = (
        "import time\n"
        f"for _ in range({lines}):\n"
        "    print(repr(time.monotonic()), flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    state = make_job_state()
    await start_job_async(node.deploy(), JobSpec((sys.executable, "-c", program)), state)
    latencies = []
    async for line in stream_logs_async(state):
        latencies.append(time.monotonic() - float(line))
    code = await wait_for_completion_async(state)
    if code != 0 or len(latencies) != lines:
        raise RuntimeError(f"follow job: {len(latencies)} of {lines} lines: {state['record']}")
    await remove_job_async(state)
    return latencies


async def measure(node: ServedNode, starts: int, cycles: int, lines: int) -> dict[str, Any]:
    await job_start_latencies(node, 3)  # warm up the daemon and this client
    job_latencies = await job_start_latencies(node, starts)
    job_cycle_rate = await job_cycles_per_s(node, cycles)
    follow = await follow_latency(node, lines)
    round_trips = summary_ms(await status_round_trips(node, starts))
    popen_latencies = popen_start_latencies(starts)
    popen_cycle_rate = popen_cycles_per_s(cycles)
    job = summary_ms(job_latencies)
    popen = summary_ms(popen_latencies)
    follow_summary = summary_ms(follow)
    over_ms = round(job["p50_ms"] - popen["p50_ms"], 2)
    return {
        "command": list(COMMAND),
        "start_to_running": {"shoal_job": job, "popen": popen, "p50_over_popen_ms": over_ms},
        "start_kill_cycles_per_s": {
            "shoal_job": round(job_cycle_rate, 1),
            "popen": round(popen_cycle_rate, 1),
            "ratio": round(job_cycle_rate / popen_cycle_rate, 4),
        },
        "follow_latency": follow_summary,
        "status_round_trip": round_trips,
        "targets": {
            "start_p50_over_popen_ms": START_TARGET_MS_OVER_POPEN,
            "follow_p99_ms": FOLLOW_TARGET_P99_MS,
            "start_met": over_ms <= START_TARGET_MS_OVER_POPEN,
            "follow_met": follow_summary["p99_ms"] <= FOLLOW_TARGET_P99_MS,
        },
        "notes": "signed requests (cluster secret); start = POST until the record says running; "
        "a cycle = start, kill (grace 0), wait for the end, delete",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--lines", type=int, default=200)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="jobs-bench-") as work,
        served_node(Path(work)) as node,
    ):
        result = asyncio.run(measure(node, args.starts, args.cycles, args.lines))
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
