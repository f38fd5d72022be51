"""A real `shoal serve` child process with a cluster secret, and the config file that reaches
it, for the job client and `shoal jobs` tests; a TCP proxy that cuts log streams at random."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from node.jobs.client import attach_job, list_jobs, terminate
from node.jobs.specs import DeploySpec
from tests.node.providers.fake_nvml import FakeGpus, write_fake_nvml

ROOT = Path(__file__).resolve().parents[3]
SECRET = b"jobs-client-secret-0123456789abcdef"
START_TIMEOUT_S = 60.0


@dataclass
class ServedNode:
    """A daemon child process: its URL, the config file that names it (with its secret)."""

    url: str
    config_file: Path
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    gpus: FakeGpus | None = None
    """The fake NVML the daemon reads instead of the host's; None: the host's GPUs."""

    def deploy(self, **fields: object) -> DeploySpec:
        """A DeploySpec reaching this node through its config file (local daemon mode)."""
        return DeploySpec(config_file=str(self.config_file), **fields)  # type: ignore[arg-type]

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> None:
        """Start `python -m node serve --config FILE`; return once /v1/health answers."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "node", "serve", "--config", str(self.config_file)],
                cwd=ROOT,
                env=child_env() if self.gpus is None else self.gpus.child_env(child_env()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(self.url):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"daemon exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon not healthy in {START_TIMEOUT_S} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) the daemon and reap it; its jobs keep running."""
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def free_port() -> int:
    """A port free for TCP (the API) and UDP (membership) on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port for TCP and UDP on 127.0.0.1")


def child_env() -> dict[str, str]:
    """This environment without SHOAL_* settings, so only the config file configures."""
    return {name: value for name, value in os.environ.items() if not name.startswith("SHOAL_")}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/health", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # it answers, if unhealthy
    except OSError:
        return False


@contextlib.contextmanager
def served_node(workdir: Path, gpus: tuple[float, ...] | None = None) -> Iterator[ServedNode]:
    """A daemon with a secret; at the end every job still running is killed and the daemon
    stopped. With `gpus`, the daemon sees one GPU per value (at that utilisation) through the
    fake NVML, whatever this host has."""
    workdir.mkdir(parents=True, exist_ok=True)
    secret_file = workdir / "secret"
    secret_file.write_bytes(SECRET)
    secret_file.chmod(0o600)
    port = free_port()
    config = {
        "node_id": "n1",
        "bind": "127.0.0.1",
        "port": port,
        "data_dir": str(workdir / "data"),
        "secret_file": str(secret_file),
        "mdns": False,
        "cluster_name": f"jobs-client-{os.getpid()}",
    }
    config_file = workdir / "shoal.yaml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    node = ServedNode(f"http://127.0.0.1:{port}", config_file, workdir / "data", workdir / "log")
    if gpus is not None:
        node.gpus = write_fake_nvml(workdir / "fake_nvml", *gpus)
    try:
        node.start()
        yield node
    finally:
        with contextlib.suppress(Exception):
            for job in list_jobs(node.deploy(), "running") + list_jobs(node.deploy(), "pending"):
                terminate(attach_job(node.deploy(), str(job["job_id"])), grace_s=0.0)
        node.stop()


class CuttingProxy:
    """A TCP proxy to `target_port` that cuts every log request's answer after a random number
    of bytes (headers included), so a follower must resume by offset; counts the cuts."""

    def __init__(self, target_port: int, rng: random.Random, max_cut_bytes: int) -> None:
        self.target_port = target_port
        self.rng = rng
        self.max_cut_bytes = max_cut_bytes
        self.cuts = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            first = await reader.read(65536)
            cut_after = None
            if b"/logs" in first.split(b"\r\n", 1)[0]:
                cut_after = self.rng.randint(1, self.max_cut_bytes)
            up_writer.write(first)
            pump = asyncio.create_task(_pump(reader, up_writer))
            try:
                sent = 0
                while True:
                    data = await up_reader.read(65536)
                    if not data:
                        break
                    if cut_after is not None and sent + len(data) >= cut_after:
                        writer.write(data[: cut_after - sent])
                        await writer.drain()
                        self.cuts += 1
                        break
                    writer.write(data)
                    await writer.drain()
                    sent += len(data)
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                up_writer.close()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()
            self._tasks.discard(task)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


@contextlib.asynccontextmanager
async def cutting_proxy(
    node: ServedNode, seed: int, max_cut_bytes: int
) -> AsyncIterator[CuttingProxy]:
    port = int(node.url.rsplit(":", 1)[1])
    async with CuttingProxy(port, random.Random(seed), max_cut_bytes) as proxy:
        yield proxy
