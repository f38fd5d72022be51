"""A loopback cluster of three voter daemons for the lock and run tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from node.daemon import NodeDaemon
from tests.node.daemons import FAST_ELECTION, test_settings

NAMES = ("v1", "v2", "v3")


async def until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Cluster:
    def __init__(self, tmp_path: Path, flags: dict[str, Any] | None = None) -> None:
        self.tmp_path = tmp_path
        self.flags = flags or {}
        self.daemons: dict[str, NodeDaemon] = {}
        self.ports: dict[str, int] = {}

    async def start(self, name: str) -> None:
        seeds = tuple(f"127.0.0.1:{p}" for n, p in self.ports.items() if n != name)
        settings = test_settings(
            self.tmp_path,
            name,
            **FAST_ELECTION,
            voters=NAMES,
            seeds=seeds,
            port=self.ports.get(name, 0),
            **self.flags,
        )
        daemon = NodeDaemon(settings)
        await daemon.start()
        self.daemons[name] = daemon
        self.ports[name] = daemon.port

    async def stop(self, name: str) -> None:
        await self.daemons.pop(name).close()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports.values()]

    async def coordinator(self) -> str | None:
        seen = set()
        async with aiohttp.ClientSession() as session:
            for daemon in self.daemons.values():
                async with session.get(f"http://127.0.0.1:{daemon.port}/v1/status") as response:
                    seen.add((await response.json())["coordinator"])
        return seen.pop() if len(seen) == 1 else None

    async def elected(self) -> str:
        found: list[str] = []

        async def one() -> bool:
            coordinator = await self.coordinator()
            if coordinator is not None and coordinator in self.daemons:
                found.append(coordinator)
                return True
            return False

        await until(one, 20, "one coordinator")
        return found[-1]


@asynccontextmanager
async def running(tmp_path: Path, **flags: Any) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path, flags)
    try:
        for name in NAMES:
            await cluster.start(name)
        await cluster.elected()
        yield cluster
    finally:
        for name in list(cluster.daemons):
            await cluster.stop(name)


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json()
