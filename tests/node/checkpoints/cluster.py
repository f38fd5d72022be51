"""Three in-process daemons on loopback for the checkpoint tests, and a stand-in for training
ranks: it writes a rank's files into its node's checkpoint directory and reports them as
shoal.checkpoint does (POST /v1/checkpoints/written with sync's content hashes)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from node import NodeDaemon
from node.checkpoints.component import CheckpointApi
from node.checkpoints.service import CheckpointService
from shoal._checkpoint_files import METADATA, METADATA_COPY, report_entry, step_directory
from tests.node.daemons import FAST_ELECTION, test_settings

NAMES = ("c1", "c2", "c3")
PIECE = 16 << 20


async def eventually(
    probe: Callable[[], Awaitable[Any]], timeout_s: float, what: str, every_s: float = 0.2
) -> Any:
    """The first truthy answer of `probe` within `timeout_s`; AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"{what} did not happen within {timeout_s} s (last: {last!r})")


class Cluster:
    """Three daemons c1..c3, every one a voter, seeded through c1."""

    def __init__(self, tmp_path: Path, stack: AsyncExitStack, session: ClientSession) -> None:
        self.tmp_path = tmp_path
        self.stack = stack
        self.session = session
        self.daemons: dict[str, NodeDaemon] = {}

    async def start(self, node_flags: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        for name in NAMES:
            seeds = (f"127.0.0.1:{self.daemons['c1'].port}",) if self.daemons else ()
            flags = {
                **FAST_ELECTION,
                "voters": NAMES,
                "seeds": seeds,
                "sync_interval_s": 0,
                "checkpoint_copy_after_s": 0,
            }
            flags.update((node_flags or {}).get(name, {}))
            daemon = NodeDaemon(test_settings(self.tmp_path, name, **flags))
            await daemon.start()
            self.stack.push_async_callback(daemon.close)
            self.daemons[name] = daemon
        await eventually(self._formed, 60, "three members and one coordinator")

    async def _formed(self) -> bool:
        coordinators = set()
        for daemon in self.daemons.values():
            runtime = daemon.runtime
            assert runtime is not None
            assert runtime.membership is not None
            alive = [m for m in runtime.membership.members() if str(m.state) == "alive"]
            runtime.refresh()
            coordinators.add(runtime.coordinator)
            if len(alive) != len(self.daemons):
                return False
        return len(coordinators) == 1 and None not in coordinators

    def coordinator(self) -> str | None:
        runtime = next(iter(self.daemons.values())).runtime
        assert runtime is not None
        runtime.refresh()
        return runtime.coordinator

    def service(self, name: str) -> CheckpointService:
        api = next(c for c in self.daemons[name].components if isinstance(c, CheckpointApi))
        return api.service

    def root(self, name: str) -> Path:
        return self.daemons[name].settings.checkpoint_dir

    def url(self, name: str, path: str) -> str:
        return f"http://127.0.0.1:{self.daemons[name].port}{path}"

    async def call(self, name: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.request(method, self.url(name, path), json=body) as response:
            return response.status, await response.json()

    async def prepare(self, name: str, body: Any, within_s: float = 30.0) -> tuple[int, Any]:
        """POST /v1/checkpoints/prepare, asked again while it answers 503 (no coordinator for
        a moment: an election under load), as shoal.checkpoint's restore does."""
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            status, answer = await self.call(name, "POST", "/v1/checkpoints/prepare", body)
            if status != 503 or asyncio.get_running_loop().time() > deadline:
                return status, answer
            await asyncio.sleep(0.2)

    async def checkpoints(self, name: str = "c1") -> dict[str, Any]:
        status, answer = await self.call(name, "GET", "/v1/checkpoints")
        return answer if status == 200 else {}

    async def write_rank(
        self,
        node: str,
        step: int,
        generation: int,
        rank: int,
        world_size: int,
        size: int,
        *,
        content: bytes | None = None,
    ) -> tuple[int, Any]:
        """Write rank `rank`'s file (`content`, else `size` random bytes; and, for rank 0, the
        metadata and its served copy) of a step into `node`'s checkpoint directory and report
        it there."""
        directory = self.root(node) / step_directory(step, generation)
        directory.mkdir(parents=True, exist_ok=True)
        names = [f"__{rank}_0.distcp"]
        (directory / names[0]).write_bytes(os.urandom(size) if content is None else content)
        if rank == 0:
            (directory / METADATA).write_bytes(f"metadata of step {step}".encode())
            os.link(directory / METADATA, directory / METADATA_COPY)
            names.append(METADATA_COPY)
        files = [report_entry(directory, name) for name in names]
        body = {
            "step": step,
            "generation": generation,
            "rank": rank,
            "world_size": world_size,
            "directory": directory.name,
            "piece_size": PIECE,
            "files": files,
        }
        return await self.call(node, "POST", "/v1/checkpoints/written", body)

    async def committed(self, step: int, name: str = "c1") -> dict[str, Any] | None:
        answer = await self.checkpoints(name)
        committed = answer.get("committed")
        return committed if committed and committed["step"] == step else None
