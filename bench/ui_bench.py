"""What the web dashboard costs its node: a `shoal` daemon child whose membership view holds 50
members (a view at the seam, every member's last-heard moving so the page gets one update a
second), with 0, 1 and 20 dashboard pages open on /v1/events (read by a process of their own,
as browsers are: a reader in the measuring process would delay its own /v1/status answers).

The 49 other members answer for real: a process of their own (the fake peers) listens on one
loopback port per member and answers /v1/status with an 8-GPU status document, so the cluster
page's fan-out (each alive member's /v1/status once a second while a page is open) is in the
daemon's CPU. The fake peers' own CPU and the requests they answered are reported apart.

Prints one JSON document: the daemon's CPU (fraction of one core) with no page, one page and
20 pages, the cost of one page (target < 1% of a core), the events each page received per
second, and /v1/status latency (p50/p99) with no page and with 20 pages (target: p99 within
+10%), with their ratios against the no-page baseline measured in the same run.
Usage: python bench/ui_bench.py [--window-s 15] [--status-requests 3000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.server import server_process  # noqa: E402

MEMBERS = 50
GPUS_PER_MEMBER = 8
PAGE_TOPICS = "status,members"
"""The cluster page's stream."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class FakeMember:
    node_id: str
    address: str
    port: int
    state: str
    incarnation: int
    born: float
    meta: Mapping[str, Any] = field(default_factory=dict)
    is_self: bool = False

    @property
    def last_seen_s(self) -> float:
        return (time.monotonic() - self.born) % 3.0


class FakeView:
    """A view of MEMBERS members, all alive, each heard from within the last 3 s; member i > 0
    at 127.0.0.1:ports[i - 1] (a fake peer)."""

    def __init__(self, node_id: str, ports: list[int]) -> None:
        now = time.monotonic()
        meta = {"role": "inference", "version": "0.1.0", "gpu_count": 8, "gpu": "H100"}
        self._members = [
            FakeMember(
                node_id if i == 0 else f"gpu-{i:03d}", "127.0.0.1",
                8770 if i == 0 else ports[i - 1], "alive", i, now - i * 0.05, meta, is_self=i == 0,
            )
            for i in range(MEMBERS)
        ]  # fmt: skip

    def members(self) -> list[FakeMember]:
        return list(self._members)

    def counts(self) -> dict[str, int]:
        return {"alive": MEMBERS, "suspect": 0, "dead": 0, "left": 0}


def fake_status(node_id: str) -> dict[str, Any]:
    """A member's /v1/status as a busy 8-GPU node answers it (GPU 7 with an Xid)."""
    gpus = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{node_id}-{i}",
         "util_pct": 97.0, "memory_used_mb": 70000.0, "memory_total_mb": 81559.0,
         "temperature_c": 61.0, "ecc_uncorrected": 0, "remapped_pending": False,
         "remapped_failed": False, "xid_errors": 1 if i == 7 else 0, "error": i == 7,
         "power_watts": 650.0, "problems": ["Xid 79"] if i == 7 else []}
        for i in range(GPUS_PER_MEMBER)
    ]  # fmt: skip
    return {
        "node_id": node_id, "cluster": "bench", "version": "0.1.0", "address": "127.0.0.1",
        "port": 0, "role": "inference", "term": 3, "coordinator": "bench", "health": "healthy",
        "wal": {"pending": 0, "oldest_pending_age_s": None}, "breakers": {"open": []},
        "gpus": gpus, "health_problems": [], "notes": [], "jobs": {"running": 1},
    }  # fmt: skip


async def fake_peers(count: int) -> None:
    """The fake peers' process: `count` members, one port each; prints PORTS p1,p2,...; GET
    /bench/requests on any port answers how many requests all of them answered."""
    import signal

    from aiohttp import web

    answered = [0]
    runners = []
    ports = []
    for i in range(1, count + 1):
        body = json.dumps(fake_status(f"gpu-{i:03d}")).encode()

        async def status(request: web.Request, body: bytes = body) -> web.Response:
            answered[0] += 1
            return web.Response(body=body, content_type="application/json")

        async def requests(request: web.Request) -> web.Response:
            return web.json_response({"requests": answered[0]})

        app = web.Application()
        app.router.add_get("/v1/status", status)
        app.router.add_get("/bench/requests", requests)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    sys.stdout.write("PORTS " + ",".join(map(str, ports)) + "\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


async def serve(data_dir: Path, ports: list[int]) -> None:
    """The child: a real daemon on loopback whose view is a FakeView; prints PORT n."""
    import signal

    from config import load_settings
    from node import NodeDaemon

    flags = {"data_dir": data_dir, "node_id": "bench", "port": 0, "mdns": False}
    settings = load_settings(env={}, flags=flags).settings
    async with NodeDaemon(settings) as daemon:
        assert daemon.runtime is not None
        daemon.runtime.membership = FakeView("bench", ports)
        sys.stdout.write(f"PORT {daemon.port}\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def read_page(session: aiohttp.ClientSession, url: str, counts: list[int]) -> None:
    """One open page: read its event stream, counting events, until cancelled."""
    async with session.get(url) as answer:
        assert answer.status == 200, await answer.text()
        async for line in answer.content:
            if line.startswith(b"event: ") and not line.startswith(b"event: hello"):
                counts[0] += 1


async def read_pages(base: str, pages: int) -> None:
    """The pages' process: open `pages` streams, print READY once each has its first event,
    then on SIGTERM print how many events arrived after READY."""
    import signal

    counts = [0]
    connected = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        url = f"{base}/v1/events?topics={PAGE_TOPICS}"
        readers = [asyncio.create_task(read_page(session, url, counts)) for _ in range(pages)]
        while counts[0] < pages * 2:  # each page's first status and members
            await asyncio.sleep(0.05)
        counts[0] = 0
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, connected.set)
        await connected.wait()
        sys.stdout.write(f"EVENTS {counts[0]}\n")
        sys.stdout.flush()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


@contextlib.asynccontextmanager
async def open_pages(base: str, pages: int) -> AsyncIterator[list[int]]:
    """`pages` open dashboard pages in a process of their own (as browsers are), connected
    and past their first snapshot; yields a list that holds, after the block, the count of
    events they received during it."""
    counts = [0]
    if pages == 0:
        yield counts
        return
    argv = [sys.executable, str(Path(__file__).resolve()), "--read-pages", str(pages), base]
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    try:
        ready = await asyncio.wait_for(process.stdout.readline(), 60)
        if ready.strip() != b"READY":
            raise RuntimeError(f"the pages' process did not connect: {ready!r}")
        yield counts
        process.terminate()
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        counts[0] = int(line.split()[1])
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def peer_requests(peers: FakePeers) -> int:
    """How many status requests the fake peers answered so far."""
    url = f"http://127.0.0.1:{peers.ports[0]}/bench/requests"
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        return int((await answer.json())["requests"])


async def with_pages(
    base: str, pages: int, window_s: float, pid: int, peers: FakePeers
) -> dict[str, float]:
    """The child's CPU fraction of one core over `window_s` with `pages` pages open, and the
    fan-out's requests per second and the fake peers' CPU over the same window."""
    async with open_pages(base, pages) as counts:
        asked = await peer_requests(peers)
        cpu, peer_cpu, started = cpu_seconds(pid), cpu_seconds(peers.pid), time.monotonic()
        await asyncio.sleep(window_s)
        cpu, elapsed = cpu_seconds(pid) - cpu, time.monotonic() - started
        peer_cpu = cpu_seconds(peers.pid) - peer_cpu
        asked = await peer_requests(peers) - asked
    events = counts[0]
    return {
        "pages": pages,
        "cpu_core_fraction": round(cpu / elapsed, 5),
        "events_per_page_per_s": round(events / max(pages, 1) / elapsed, 2),
        "member_status_requests_per_s": round(asked / elapsed, 2),
        "fake_peers_cpu_core_fraction": round(peer_cpu / elapsed, 5),
    }


async def status_batch(base: str, requests: int) -> list[float]:
    """Latencies (ms) of `requests` GET /v1/status, one at a time."""
    latencies = []
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            started = time.perf_counter()
            async with session.get(f"{base}/v1/status") as answer:
                await answer.read()
                assert answer.status == 200
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def status_latency(base: str, requests: int, rounds: int) -> list[dict[str, float]]:
    """p50/p99 of GET /v1/status with no page and with 20 pages open, in alternating
    rounds (so a noisy minute of the machine hits both alike)."""
    samples: dict[int, list[float]] = {0: [], 20: []}
    for _ in range(rounds):
        for pages in (0, 20):
            async with open_pages(base, pages):
                samples[pages] += await status_batch(base, requests // rounds)
    out = []
    for pages, latencies in samples.items():
        cuts = statistics.quantiles(latencies, n=100)
        out.append({"pages": pages, "p50_ms": round(cuts[49], 3), "p99_ms": round(cuts[98], 3)})
    return out


@dataclass(frozen=True)
class FakePeers:
    pid: int
    ports: list[int]


@contextlib.asynccontextmanager
async def start_fake_peers(count: int) -> AsyncIterator[FakePeers]:
    """The fake peers' process, listening; SIGTERMed after the block."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--fake-peers", str(count)]
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if not line.startswith(b"PORTS "):
            raise RuntimeError(f"the fake peers did not start: {line!r}")
        ports = [int(port) for port in line.split()[1].split(b",")]
        yield FakePeers(process.pid, ports)
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with start_fake_peers(MEMBERS - 1) as peers:
            ports = ",".join(map(str, peers.ports))
            argv = [str(Path(__file__).resolve()), "--serve", tmp, "--peer-ports", ports]
            with server_process(argv) as port:
                pid = _child_pid(port)
                base = f"http://127.0.0.1:{port}"
                await asyncio.sleep(args.warm_s)
                idle = await with_pages(base, 0, args.window_s, pid, peers)
                one = await with_pages(base, 1, args.window_s, pid, peers)
                twenty = await with_pages(base, 20, args.window_s, pid, peers)
                status_idle, status_loaded = await status_latency(
                    base, args.status_requests, args.rounds
                )
    one_page = one["cpu_core_fraction"] - idle["cpu_core_fraction"]
    p99_ratio = status_loaded["p99_ms"] / status_idle["p99_ms"]
    return {
        "members": MEMBERS,
        "member_status_answered_by": "fake peers (a process of their own, one port each)",
        "topics": PAGE_TOPICS,
        "window_s": args.window_s,
        "cpu_resolution_core_fraction": round(1 / CLOCK_TICKS / args.window_s, 5),
        "cpu": [idle, one, twenty],
        "one_page_core_fraction": round(one_page, 5),
        "one_page_ratio_to_idle": round(one["cpu_core_fraction"] / idle["cpu_core_fraction"], 3),
        "twenty_pages_core_fraction": round(
            twenty["cpu_core_fraction"] - idle["cpu_core_fraction"], 5
        ),
        "status": [status_idle, status_loaded],
        "status_p99_ratio_20_pages": round(p99_ratio, 3),
        "status_p50_ratio_20_pages": round(status_loaded["p50_ms"] / status_idle["p50_ms"], 3),
        "targets": {
            "one_page_below_1pct_core": one_page < 0.01,
            "status_p99_within_10pct": p99_ratio <= 1.10,
        },
    }


def _child_pid(port: int) -> int:
    """The pid listening on `port` (the server child)."""
    inode = None
    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in table.readlines()[1:]:
            parts = line.split()
            if int(parts[1].split(":")[1], 16) == port and parts[3] == "0A":
                inode = parts[9]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
        except OSError:
            continue
    raise RuntimeError(f"no process listens on port {port}")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", metavar="DATA_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--read-pages", nargs=2, metavar=("N", "BASE"), help=argparse.SUPPRESS)
    parser.add_argument("--peer-ports", default="", help=argparse.SUPPRESS)
    parser.add_argument("--fake-peers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--window-s", type=float, default=15.0)
    parser.add_argument("--warm-s", type=float, default=5.0)
    parser.add_argument("--status-requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(Path(args.serve), [int(p) for p in args.peer_ports.split(",") if p]))
        return
    if args.fake_peers:
        asyncio.run(fake_peers(args.fake_peers))
        return
    if args.read_pages:
        asyncio.run(read_pages(args.read_pages[1], int(args.read_pages[0])))
        return
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    run()
