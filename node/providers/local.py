"""The `local` provider: up to N shoal daemons on this machine's loopback, each its own
process, port and data dir (for tests and demos). GPU fields of a query are ignored (labelled
so); a node's `url` is its daemon's API; it has no SSH target. Each node's config says
`provider: local`, so a node that auto-stops ends its own daemon and is listed stopped."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from config import AsyncClosing
from net import PeerClient, PeerRequestError, peer_url
from node.errors import ProviderError
from node.providers.base import RUNNING, STOPPED, ActionResult, GPUQuery, NodeHandle

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
IGNORED = "type,count,max_price,min_vram_gb,min_cuda,cloud_type,disks"


def _free_port() -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port: int = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise ProviderError("local provider: no port free for both TCP and UDP on 127.0.0.1")


@dataclass
class _Node:
    id: str
    port: int
    directory: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return peer_url("127.0.0.1", self.port)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class LocalProvider(AsyncClosing):
    """Daemons on loopback under `base_dir` (owns their processes; async context manager,
    close() stops every node and is idempotent)."""

    name = "local"

    def __init__(
        self,
        base_dir: Path,
        capacity: int = 3,
        *,
        python: str | None = None,
        node_settings: Mapping[str, Any] | None = None,
    ) -> None:
        """`node_settings`: more settings of every node's config (an `autostop:` section)."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.base_dir = base_dir
        self.capacity = capacity
        self.python = python or sys.executable
        self.node_settings = dict(node_settings or {})
        self._nodes: dict[str, _Node] = {}
        self._count = 0

    def _handle(self, node: _Node, state: str | None = None) -> NodeHandle:
        return NodeHandle(
            provider=self.name,
            id=node.id,
            ssh=None,
            state=state or (RUNNING if node.running else STOPPED),
            labels={"ignored": IGNORED, "pid": str(node.process.pid if node.process else "")},
            url=node.url,
        )

    def _node(self, handle: NodeHandle) -> _Node:
        node = self._nodes.get(handle.id)
        if handle.provider != self.name or node is None:
            raise ProviderError(f"local provider: {handle.provider}/{handle.id} is not held here")
        return node

    async def acquire(self, query: GPUQuery) -> NodeHandle:
        if len(self._nodes) >= self.capacity:
            raise ProviderError(
                f"local provider: all {self.capacity} nodes are acquired; release one first"
            )
        self._count += 1
        node_id = f"local-{self._count}"
        node = _Node(node_id, _free_port(), self.base_dir / node_id)
        self._nodes[node_id] = node
        try:
            await self._start(node)
        except BaseException:
            await self._stop(node)
            del self._nodes[node_id]
            raise
        return self._handle(node)

    async def _start(self, node: _Node) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        config = node.directory / "node.yaml"
        settings = {
            "node_id": node.id,
            "bind": "127.0.0.1",
            "port": node.port,
            "data_dir": str(node.directory / "data"),
            "mdns": False,
            "provider": self.name,
            **self.node_settings,
        }
        config.write_text(yaml.safe_dump(settings))
        log = (node.directory / "daemon.log").open("ab")
        try:
            node.process = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "node.cli",
                "serve",
                "--config",
                str(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        await self._wait_healthy(node)

    async def _wait_healthy(self, node: _Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with PeerClient() as peers:
            while time.monotonic() < deadline:
                if not node.running:
                    raise ProviderError(
                        f"local provider: {node.id} exited at start; see "
                        f"{node.directory / 'daemon.log'}"
                    )
                with contextlib.suppress(PeerRequestError):
                    answer = await peers.request(
                        "GET", node.url, "/v1/health", timeout_s=2.0, check=False
                    )
                    if answer.status == 200:
                        return
                await asyncio.sleep(0.1)
        raise ProviderError(f"local provider: {node.id} not healthy within {START_TIMEOUT_S:g}s")

    async def _stop(self, node: _Node) -> bool:
        process = node.process
        if process is None or process.returncode is not None:
            return False
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
        return True

    async def release(self, handle: NodeHandle) -> None:
        node = self._node(handle)
        await self._stop(node)
        del self._nodes[node.id]
        await asyncio.to_thread(shutil.rmtree, node.directory, True)

    async def start(self, handle: NodeHandle) -> ActionResult:
        node = self._node(handle)
        if node.running:
            return ActionResult(self._handle(node), False, f"{node.id} already runs")
        await self._start(node)
        return ActionResult(self._handle(node), True, f"{node.id} started")

    async def stop(self, handle: NodeHandle) -> ActionResult:
        node = self._node(handle)
        changed = await self._stop(node)
        return ActionResult(
            self._handle(node), changed, f"{node.id} stopped" if changed else "already stopped"
        )

    async def list(self) -> list[NodeHandle]:
        return [self._handle(node) for _, node in sorted(self._nodes.items())]

    async def close(self) -> None:
        """Stop every node (their data dirs stay); idempotent."""
        for node in list(self._nodes.values()):
            await self._stop(node)
