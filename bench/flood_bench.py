"""Signed requests beside attacks on the unauthenticated surface: one daemon (auth hmac+tls, a
dashboard token) in a child process; a signed client times GET /v1/status (and a small signed
POST) idle, then under each attack alone and under all at once: slowloris heads (plain), slow
TLS heads, slow bodies behind made-up signature headers, gzip-bomb logins and 60 MiB logins,
each kept going for the whole measurement by a process of its own (so the attackers' CPU is
not the timing client's). Prints JSON: the signed requests' p50/p99 idle and under attack,
their ratio (goal: p99 within 2x of idle), and the daemon's RSS idle and peak.

    python -m bench.flood_bench [--requests 200] [--slow 4] [--tls 3] [--logins 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp

from config import signing_middleware
from tests.node.tls_pki import Pki
from tests.security.attackers import login_post, slow_bodies, slow_tls_heads
from tests.security.daemon_process import (
    ROOT,
    SECRET,
    Served,
    rss_bytes,
    served_daemon,
    settled_rss_bytes,
)

Attack = Callable[[Served, argparse.Namespace], AbstractAsyncContextManager[Any]]


@contextlib.asynccontextmanager
async def _logins(port: int, count: int, *, gzipped: bool) -> AsyncIterator[None]:
    """`count` clients posting logins one after another until the block ends."""
    running = True

    async def client() -> None:
        while running:
            await login_post(port, gzipped=gzipped)

    tasks = [asyncio.create_task(client()) for _ in range(count)]
    try:
        yield
    finally:
        running = False
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def _everything(served: Served, args: argparse.Namespace) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for attack in ATTACKS.values():
            await stack.enter_async_context(attack(served, args))
        yield


ATTACKS: dict[str, Attack] = {  # (the bench runs each in a child process: _attacker)
    "slowloris": lambda s, a: slow_tls_heads(s.port, a.slow, None),
    "slow_tls": lambda s, a: slow_tls_heads(s.port, a.tls, s.pki.client(None), server_hostname="a"),
    "slow_bodies": lambda s, a: slow_bodies(s.port, a.slow),
    "gzip_logins": lambda s, a: _logins(s.port, a.logins, gzipped=True),
    "login_60mib": lambda s, a: _logins(s.port, a.logins, gzipped=False),
}


async def _timings(session: aiohttp.ClientSession, port: int, count: int) -> list[float]:
    """Seconds of `count` signed requests, one at a time: GET /v1/status and, every tenth, a
    small signed POST (a body read with a permit, as a heartbeat's)."""
    base = f"http://127.0.0.1:{port}"
    times = []
    for index in range(count):
        started = time.monotonic()
        if index % 10 == 9:
            request = session.post(f"{base}/v1/records/games", json=[])
        else:
            request = session.get(f"{base}/v1/status")
        async with request as answer:
            await answer.read()
            if answer.status >= 500:
                raise RuntimeError(f"HTTP {answer.status}: {await answer.text()}")
        times.append(time.monotonic() - started)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000}


async def _run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    with served_daemon(root) as served:
        pid = served.process.pid
        signer = signing_middleware(SECRET, "cli-flood-bench")
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(middlewares=(signer,), timeout=timeout) as session:
            await _timings(session, served.port, 5)  # the node's id learnt, warm
            idle_rss = await asyncio.to_thread(settled_rss_bytes, pid)
            idle = _summary(await _timings(session, served.port, args.requests))
            result: dict[str, Any] = {"idle": idle, "rss_idle_mib": idle_rss / 2**20}
            for name in [*ATTACKS, "all"]:
                peak = rss_bytes(pid)
                async with _attacker(name, served, args, root):
                    await asyncio.sleep(1.0)
                    times = await _timings(session, served.port, args.requests)
                    peak = max(peak, rss_bytes(pid))
                under = _summary(times)
                under["p99_ratio"] = under["p99_ms"] / idle["p99_ms"]
                under["rss_peak_mib"] = peak / 2**20
                result[name] = under
            assert served.process.poll() is None, "the daemon died under the attack"
    everything = result["all"]
    result["summary"] = {
        "signed_p99_idle_ms": idle["p99_ms"],
        "signed_p99_under_attack_ms": everything["p99_ms"],
        "ratio": everything["p99_ratio"],
        "goal_ratio": 2.0,
        "rss_idle_mib": result["rss_idle_mib"],
        "rss_under_attack_mib": everything["rss_peak_mib"],
    }
    return result


@contextlib.asynccontextmanager
async def _attacker(
    name: str, served: Served, args: argparse.Namespace, root: Path
) -> AsyncIterator[None]:
    """Attack `name` in a child process, on once it says so, ended (SIGTERM) at the end."""
    argv = [sys.executable, "-m", "bench.flood_bench", "--attack", name, "--port"]
    argv += [str(served.port), "--pki", str(served.pki.root), "--slow", str(args.slow)]
    argv += ["--tls", str(args.tls), "--logins", str(args.logins)]
    child = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=(root / f"{name}.log").open("wb")
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60.0)
        if line.strip() != b"on":
            raise RuntimeError(f"attack {name} did not start: {(root / f'{name}.log').read_text()}")
        yield
    finally:
        if child.returncode is None:
            child.terminate()
        await child.wait()


async def _attack_until_stopped(args: argparse.Namespace) -> None:
    served = Served(None, args.port, Pki(Path(args.pki)))  # type: ignore[arg-type]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    attack = _everything if args.attack == "all" else ATTACKS[args.attack]
    async with attack(served, args):
        print("on", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--slow", type=int, default=4, help="slowloris and slow-body sockets")
    parser.add_argument("--tls", type=int, default=3, help="slow TLS clients")
    parser.add_argument("--logins", type=int, default=4, help="concurrent login posters")
    parser.add_argument("--attack", help=argparse.SUPPRESS)  # (a child: run this attack)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pki", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attack:
        asyncio.run(_attack_until_stopped(args))
        return 0
    with tempfile.TemporaryDirectory(prefix="shoal-flood-") as root:
        result = asyncio.run(_run(args, Path(root)))
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
